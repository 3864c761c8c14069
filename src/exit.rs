//! How pmcheck's commands end: one table of exit codes for every command, the usage-error
//! mapping and the man page's EXIT STATUS section.
//!
//! `check` speaks the monitoring-plugin convention (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN), so
//! Nagios, Icinga and Sensu read it as it is; `status` reuses 0 and 1; everything else that can
//! fail uses sysexits(3), so scripts can tell a typo from a taken port.

/// One exit code, its number the discriminant; what it means is said once, by
/// [`Exit::meaning`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// 0: success; `check`: OK.
    Ok = 0,
    /// 1: `check`: WARNING.
    Warning = 1,
    /// 2: `check`: CRITICAL.
    Critical = 2,
    /// 3: `check`: UNKNOWN.
    Unknown = 3,
    /// 64, EX_USAGE.
    Usage = 64,
    /// 69, EX_UNAVAILABLE.
    Unavailable = 69,
    /// 71, EX_OSERR.
    OsErr = 71,
    /// 73, EX_CANTCREAT.
    CantCreate = 73,
    /// 75, EX_TEMPFAIL.
    TempFail = 75,
    /// 76, EX_PROTOCOL.
    Protocol = 76,
    /// 77, EX_NOPERM.
    Refused = 77,
    /// 78, EX_CONFIG.
    Config = 78,
    /// 79: `drain --wait`: the drain is written and held.
    Held = 79,
    /// 130, 128 + SIGINT: `cycle` was interrupted by a signal.
    Interrupted = 130,
}

impl Exit {
    /// Every code, in the man page's order.
    pub const ALL: [Exit; 14] = [
        Exit::Ok,
        Exit::Warning,
        Exit::Critical,
        Exit::Unknown,
        Exit::Usage,
        Exit::Unavailable,
        Exit::OsErr,
        Exit::CantCreate,
        Exit::TempFail,
        Exit::Protocol,
        Exit::Refused,
        Exit::Config,
        Exit::Held,
        Exit::Interrupted,
    ];

    /// The number the process exits with.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// What it means, for the man page.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => {
                "success; check: OK; status: the daemon answers 200; drain --wait: safe to stop \
                 Puppet Server; cycle: done"
            }
            Exit::Warning => {
                "check: WARNING, drained while Puppet Server is healthy, or its JRuby pool paused; \
                 status: the daemon does not answer 200; drain: let go of (`undrain --force`) \
                 before the load balancers' checks came; cycle: the command failed (the node \
                 stays drained), or its hold was let go of"
            }
            Exit::Critical => {
                "check: CRITICAL, Puppet Server is down or not ready; cycle: Puppet Server did \
                 not come back healthy within --max-wait (the node stays drained)"
            }
            Exit::Unknown => {
                "check: UNKNOWN, bad arguments or settings, unreadable drain state or certificate \
                 files"
            }
            Exit::Usage => "bad arguments (EX_USAGE); check exits 3 instead",
            Exit::Unavailable => {
                "the listen address is taken or absent; status, --wait, cycle: the daemon cannot \
                 be reached (EX_UNAVAILABLE; status --json then prints {\"error\": ...}); \
                 drain, cycle: a daemon runs but did not answer the last-server guard, so \
                 nothing was written (--force drains without the check)"
            }
            Exit::OsErr => "another system error: sockets, systemd, output (EX_OSERR)",
            Exit::CantCreate => "the drain record cannot be written or removed (EX_CANTCREAT)",
            Exit::TempFail => {
                "--wait or a wait of cycle timed out; a drain stays in place (EX_TEMPFAIL)"
            }
            Exit::Protocol => {
                "drain, undrain, cycle: the daemon is of another version (after a package \
                 upgrade, before `systemctl restart pmcheck`), whose /status lacks the progress \
                 these commands read; both versions are named; drain and cycle write nothing, \
                 undrain --wait has let go already (EX_PROTOCOL)"
            }
            Exit::Refused => {
                "drain, cycle: refused, a load balancer would hold the drain: it says this node is \
                 the only server taking new agents in its backend, or that none is left (a \
                 cycle waits its turn for --max-wait first; once drained, a cycle whose backend \
                 has no server left lets go and runs nothing); nothing was written, or the drain \
                 held at the checks right after it was undone; undrain: refused, a running cycle \
                 holds the node (--force overrides each); roll begin: another roll's mark is \
                 here and has not lapsed, or the mark cannot be read (EX_NOPERM)"
            }
            Exit::Config => {
                "a bad setting: puppet.conf, a value, the environment file; config --check: a \
                 file the daemon cannot read, or a PMCHECK_ name no option reads (EX_CONFIG)"
            }
            Exit::Held => {
                "drain --wait: the drain is written and held: a load balancer says this node is \
                 the only server taking new agents in its backend (another master left after \
                 the drain took effect); the drain stays and takes effect once another server \
                 takes agents there: do not stop Puppet Server"
            }
            Exit::Interrupted => "cycle was interrupted by a signal; the node stays drained",
        }
    }

    /// The code for a command line clap rejected: `check` follows the monitoring-plugin
    /// convention (3 UNKNOWN), everything else EX_USAGE; help and version are a success.
    pub fn for_usage(error: &clap::Error, args: &[String]) -> Exit {
        use clap::error::ErrorKind;
        let command = args.iter().skip(1).find(|a| !a.starts_with('-'));
        match error.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Exit::Ok,
            _ if command.is_some_and(|c| c == "check") => Exit::Unknown,
            _ => Exit::Usage,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        std::process::ExitCode::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed_once() {
        let mut codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Exit::ALL.len());
    }
}
