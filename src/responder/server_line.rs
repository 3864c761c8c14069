//! One server line of a load balancer (a backend and its server for this node), as the
//! daemon keeps it: the latest `X-Haproxy-Server-State` its HTTP checks sent, what that check
//! was answered (held or not: [`crate::health::hold`]), what the agent checks that name the
//! line were told, and the line's own rhythm. Also the one definition of whether something
//! still polls ([`polling`]), for pollers, their kinds of check and their server lines alike.

use std::time::{Duration, Instant, SystemTime};

use crate::health::hold::{self, Held};
use crate::health::lb_state::{self, Malformed};
use crate::health::verdict::Verdict;
use crate::protocol::ToldAnswer;
use crate::text::ms;

/// The silence a poller may keep and still poll: three of its own intervals, within these
/// bounds (the least also before its second poll gave its rhythm). A load balancer checking
/// every 2 s polls until it has been silent 6 s; a one-off curl stops 5 s after its poll; none
/// polls after a minute of silence (a load balancer taken out of service, a check turned off,
/// a server in MAINT, which HAProxy does not check).
pub const SILENCE: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(60));

/// How long a line whose headers flipped between two views of the backend stays judged as two
/// load balancers answering as one ([`Held::TwoViews`]): as long as a poller is remembered, so
/// that views that agree for a while are not trusted again before they are told apart.
pub const TWO_VIEWS_FOR: Duration = Duration::from_secs(600);

/// Changes of view in a row, each back to the one before, that only two load balancers
/// answering as one make.
pub const FLIPS: u8 = 3;

/// Whether something that last polled at `last`, `gap` after the poll before, still polls at
/// `now`: the one definition, for pollers, their kinds of check and their server lines.
pub fn polling(last: Instant, gap: Option<Duration>, now: Instant) -> bool {
    let limit = gap.map_or(SILENCE.0, |g| (g * 3).clamp(SILENCE.0, SILENCE.1));
    now.saturating_duration_since(last) <= limit
}

/// What one kind of check was told last, and how many times in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    /// The verdict of the latest answer.
    pub verdict: Verdict,
    /// How many answers in a row carried it.
    pub times: u32,
    /// When the first answer of the run was given.
    pub since: Instant,
    /// When the latest answer was given.
    pub last: Instant,
    /// The time between the latest two checks of this kind, whatever they were told: its
    /// rhythm, by which its silence is judged.
    pub gap: Option<Duration>,
}

impl Told {
    /// The first answer of a run, or the next of the same verdict.
    pub(crate) fn next(told: Option<Told>, verdict: Verdict, now: Instant) -> Told {
        let gap = told.map(|t| now.saturating_duration_since(t.last));
        match told {
            Some(t) if t.verdict == verdict => Told {
                times: t.times.saturating_add(1),
                last: now,
                gap,
                ..t
            },
            _ => Told {
                verdict,
                times: 1,
                since: now,
                last: now,
                gap,
            },
        }
    }

    /// Still checks, by its own rhythm ([`polling`]).
    pub fn polling(&self, now: Instant) -> bool {
        polling(self.last, self.gap, now)
    }

    pub(crate) fn answer(&self, now: Instant) -> ToldAnswer {
        ToldAnswer {
            told: self.verdict,
            times: self.times,
            last_ms_ago: ms(now.saturating_duration_since(self.last)),
            since_ms_ago: ms(now.saturating_duration_since(self.since)),
        }
    }
}

/// One server line of a load balancer (its backend and server): the raw
/// `X-Haproxy-Server-State` of its latest HTTP check, kept inline so that recording it
/// allocates nothing (it is read only for the drain rule and the operator), what that check
/// was answered, and what the agent checks that name the line were told.
///
/// HAProxy writes the header before it reads the answer to that check: a header shows the
/// effect of the answers to the checks before it. So it is kept with what that server line was
/// answered, and since when in a row.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ServerLine {
    /// When its latest header came.
    pub at: Instant,
    /// The time between its latest two headers: the line's own rhythm.
    pub gap: Option<Duration>,
    /// What the check that carried it was answered.
    pub told: Verdict,
    /// The first check of this server line answered `told`, in a row.
    pub since: Instant,
    /// That check was answered as not drained because the drain was held here.
    pub held: Option<Held>,
    /// The latest check of this line that was held, and when.
    pub(crate) held_last: Option<(Held, Instant)>,
    /// What the agent checks that name this line were told.
    pub agent: Option<Told>,
    /// It read well when it came: only such a header is matched by its server line's name.
    pub(crate) well_formed: bool,
    /// What its header says that the drain rule reads ([`lb_state::hold_view`]), and what the
    /// one before said.
    view: Option<(bool, bool)>,
    view_before: Option<Option<(bool, bool)>>,
    /// When its headers last flipped between two views at [`FLIPS`] checks in a row (A, B, A,
    /// B within a few seconds each): two load balancers answer as one here.
    pub two_views: Option<Instant>,
    /// How many of its latest headers in a row changed the view, each within a few seconds.
    flips: u8,
    len: usize,
    bytes: [u8; lb_state::LIMIT],
}

impl ServerLine {
    pub(crate) fn new(at: Instant, header: &[u8], well_formed: bool) -> Self {
        let mut bytes = [0; lb_state::LIMIT];
        let kept = header.len().min(lb_state::LIMIT);
        bytes[..kept].copy_from_slice(&header[..kept]);
        Self {
            at,
            gap: None,
            told: Verdict::Starting,
            since: at,
            held: None,
            held_last: None,
            agent: None,
            well_formed,
            view: lb_state::hold_view(header),
            view_before: None,
            two_views: None,
            flips: 0,
            // One past the limit says it was longer.
            len: header.len().min(lb_state::LIMIT + 1),
            bytes,
        }
    }

    /// Takes over what `before`, the same line's header before this one, knew: its rhythm,
    /// its agent checks, since when it is answered so, and whether two views answer as one.
    pub(crate) fn follows(&mut self, before: &ServerLine) {
        let gap = self.at.saturating_duration_since(before.at);
        self.gap = Some(gap);
        self.agent = before.agent;
        if before.told == self.told {
            self.since = before.since;
        }
        self.held_last = self.held_last.or(before.held_last);
        self.view_before = Some(before.view);
        self.two_views = before.two_views;
        // Back and forth at every check, within a few seconds each: one HAProxy changes its
        // view only when a server joins or leaves the backend, which takes `rise` or `fall`
        // checks. Once back is an operator undraining and draining again (this node or
        // another) as fast as the checks go: measured with one HAProxy 3.x; A, B, A, B is not.
        let quick = gap <= SILENCE.0 && before.gap.is_some_and(|g| g <= SILENCE.0);
        let changed = quick && before.view != self.view;
        self.flips = if changed {
            before.flips.saturating_add(1)
        } else {
            0
        };
        if self.flips >= FLIPS && before.view_before == Some(self.view) {
            self.two_views = Some(self.at);
        }
    }

    /// The server line it is about (`BACKEND/SERVER`).
    pub fn name(&self) -> &[u8] {
        lb_state::name_of(self.kept())
    }

    /// Which HAProxy wrote it (`node=`).
    pub fn node(&self) -> &[u8] {
        lb_state::node_of(self.kept())
    }

    fn kept(&self) -> &[u8] {
        &self.bytes[..self.len.min(lb_state::LIMIT)]
    }

    /// Why a drain was held at this line by its latest check, or by one within [`SILENCE`]'s
    /// least: what an agent check follows. Two processes answering as one alternate held and
    /// not held check by check before they are told apart, and an agent check following the
    /// latest alone could take out the node one of them holds; one HAProxy's agent check only
    /// says `drain` a few seconds after its HTTP check took the node out.
    pub fn held_lately(&self, now: Instant) -> Option<Held> {
        let lately = |(held, at): (Held, Instant)| {
            (now.saturating_duration_since(at) < SILENCE.0).then_some(held)
        };
        self.held.or_else(|| self.held_last.and_then(lately))
    }

    /// The header, read.
    pub fn read(&self) -> Result<lb_state::LbState, Malformed> {
        if self.len > lb_state::LIMIT {
            return Err(Malformed::TooLong);
        }
        lb_state::parse(&self.bytes[..self.len])
    }

    /// The line is still checked, by its own rhythm ([`polling`]).
    pub fn polling(&self, now: Instant) -> bool {
        polling(self.at, self.gap, now)
    }

    /// What the drain rule meets at this line for `lb`, its header as read at `at`: the facts
    /// it is decided from are this line's.
    pub fn holds(&self, lb: &lb_state::LbState, at: Instant, now: Instant) -> Option<Held> {
        // Young until its checks have been answered DRAINED that long.
        let young = self.told != Verdict::Drained
            || now.saturating_duration_since(self.since) < hold::YOUNG;
        // Two load balancers answer as one here, as its headers showed within [`TWO_VIEWS_FOR`].
        let doubled =
            (self.two_views).is_some_and(|t| now.saturating_duration_since(t) < TWO_VIEWS_FOR);
        // The agent checks that name this line had been told `drain` at `at` (and still check):
        // HAProxy then keeps the server in DRAIN, out of the backend's total weight.
        let agent_out = (self.agent)
            .is_some_and(|a| a.verdict == Verdict::Drained && a.since <= at && a.polling(now));
        hold::holds(lb, agent_out, young, doubled)
    }
}

impl std::fmt::Debug for ServerLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerLine")
            .field("at", &self.at)
            .field("told", &self.told)
            .field("held", &self.held)
            .field("header", &String::from_utf8_lossy(self.kept()))
            .finish()
    }
}

/// What an agent check follows: what the HTTP checks of its server line were answered last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Followed {
    /// The verdict of the latest HTTP check of the line (of the most careful line, when the
    /// agent check names none this load balancer still checks).
    pub told: Verdict,
    /// That check was held ([`crate::health::hold`]).
    pub held: Option<Held>,
    /// It is the line the agent check named, and that check is its own.
    pub placed: bool,
}

/// What the drain rule meets at a proven load balancer's server `line` for `lb`, the header of
/// its HTTP check under way. Of a line it has no record of (the daemon started since, or the
/// line is new), the drain is as young as the record says (`drained_at`: since when its
/// holders hold the node, at `wall`), and no agent check said `drain` there that the daemon
/// knows of.
pub fn held_at(
    line: Option<&ServerLine>,
    lb: &lb_state::LbState,
    now: Instant,
    drained_at: Option<SystemTime>,
    wall: SystemTime,
) -> Option<Held> {
    if let Some(line) = line {
        return line.holds(lb, now, now);
    }
    let young =
        drained_at.is_none_or(|since| wall.duration_since(since).unwrap_or_default() < hold::YOUNG);
    hold::holds(lb, false, young, false)
}
