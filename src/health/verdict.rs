//! The verdict: the first word of every answer, and what HAProxy acts on. How it is decided is
//! [`crate::health::decision`].

use serde::{Deserialize, Serialize};

/// What HAProxy is told: the first word of every answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Puppet Server is running and the node is not drained: the only 200.
    Ok,
    /// An operator drained the node.
    Drained,
    /// Puppet Server failed the probe.
    Down,
    /// Puppet Server answers but cannot compile yet (starting, pool locked or empty).
    #[serde(rename = "NOTREADY")]
    NotReady,
    /// No probe has finished yet.
    Starting,
    /// pmcheck cannot tell (unreadable drain record, stuck prober, unusable identity): fail closed.
    Unknown,
}

impl Verdict {
    /// Every verdict, in declaration order (a verdict's index in it is `verdict as usize`).
    pub const ALL: [Verdict; 6] = [
        Verdict::Ok,
        Verdict::Drained,
        Verdict::Down,
        Verdict::NotReady,
        Verdict::Starting,
        Verdict::Unknown,
    ];

    /// The word itself.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::Drained => "DRAINED",
            Verdict::Down => "DOWN",
            Verdict::NotReady => "NOTREADY",
            Verdict::Starting => "STARTING",
            Verdict::Unknown => "UNKNOWN",
        }
    }

    /// The HTTP status HAProxy acts on (a drain's may be 404 instead: [`crate::health::decision::Rules::drained_status`]).
    pub fn status(self) -> u16 {
        if self == Verdict::Ok { 200 } else { 503 }
    }

    /// The status line's reason phrase, which HAProxy shows in its check info.
    pub fn reason_phrase(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::Drained => "Drained",
            Verdict::Down => "Puppet Server Down",
            Verdict::NotReady => "Not Ready",
            Verdict::Starting => "Starting",
            Verdict::Unknown => "Health Unknown",
        }
    }
}
