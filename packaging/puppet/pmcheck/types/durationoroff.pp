# @summary A duration that may be zero, meaning off (`--slow-start 0s`): `0s`, `10s`, `2m`.
type Pmcheck::DurationOrOff = Pattern[/\A[0-9]+(ms|s|m|h)\z/]
