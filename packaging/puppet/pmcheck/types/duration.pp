# @summary A duration as pmcheck reads it, longer than zero: `1500ms`, `2s`, `30m`, `1h`.
type Pmcheck::Duration = Pattern[/\A0*[1-9][0-9]*(ms|s|m|h)\z/]
