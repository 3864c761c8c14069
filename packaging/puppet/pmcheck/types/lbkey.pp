# @summary One load balancer's key for class pmcheck's `lb_keys`: the key (32 to 128 of
#   A-Z a-z 0-9 . _ ~ + / = -, as `openssl rand -hex 32` makes) and the addresses it is sent from.
type Pmcheck::LbKey = Struct[{
    key       => Sensitive[Pattern[/\A[A-Za-z0-9._~+\/=-]{32,128}\z/]],
    addresses => Array[Pmcheck::Cidr, 1],
}]
