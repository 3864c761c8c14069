//! The operator's view of the node, `/status` from this host: the poll's answer, and who polls
//! with what each load balancer said and was told, for each of its server lines, what the
//! drain rule ([`crate::health::hold`]) meets there; the agent connections; the certificates'
//! and the deploy records' dates. `pmcheck status`, the waits, `drain`, `cycle` and `on-stop`
//! read it (`operator::view`); another host gets only the poll's answer.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::health::answer::Answer;
use crate::health::hold::Held;
use crate::health::lb_state::LbState;
use crate::health::verdict::Verdict;
use crate::puppet::code::{Found, Reading};
use crate::puppet::expiry::{self, Expiries};
use crate::puppet::file_sync::FileSync;
use crate::responder::pollers::Pollers;
use crate::settings::lb_proof::{KeyFileAnswer, Proof};

/// The operator's JSON: the poll's answer, and what only the operator reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status<'a> {
    /// What a poll from nobody in particular is answered now.
    #[serde(flatten)]
    pub answer: Answer<'a>,
    /// Whether the daemon answers HAProxy's agent check (`--agent-listen`), without which no
    /// weight is sent.
    pub agent_check: bool,
    /// Who polls this node, what each said and was told.
    pub pollers: Vec<PollerAnswer>,
    /// The agent connections to Puppet Server; `None` where the node watches none (inetd
    /// mode, whose process lives for one poll).
    pub traffic: Option<TrafficAnswer>,
    /// How long the daemon has listened: a wait does not believe that nobody polls before it
    /// has listened for a check interval.
    pub listening_ms: u64,
    /// The drain record the daemon watches.
    pub drain_file: String,
    /// Polls from addresses the poller table had no room for, when there were any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unrecorded: Option<UnrecordedAnswer>,
    /// The certificates' and the CRL's dates, as the daemon last read them (a daemon serves
    /// them; inetd mode does not read them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<CertificatesAnswer>,
    /// The deploy records of `--code-environment`, as the daemon last read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Vec<CodeAnswer>>,
    /// The load balancers' key file, when one is set: whether it can be used, and the
    /// addresses each key is bound to (never the keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lb_key_file: Option<KeyFileAnswer>,
}

impl Status<'_> {
    /// The JSON body, one line and a newline.
    pub fn to_json(&self) -> String {
        crate::health::answer::json_line(self)
    }

    /// Reads a JSON body back.
    pub fn from_json(text: &str) -> serde_json::Result<Status<'static>> {
        serde_json::from_str(text)
    }
}

/// One environment's deploy record ([`crate::puppet::code`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeAnswer {
    /// The environment.
    pub environment: String,
    /// `deployed`, `failed` (`deploy_success` false), `no_environment` (no directory on the
    /// environmentpath), `no_record` or `unreadable`.
    pub state: String,
    /// The record's path (where it would be, for `no_record`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `signature`: the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// `started_at`, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// `finished_at`, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Seconds since `finished_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<i64>,
    /// Why the record is unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Puppet Enterprise's file sync: its `status` for this environment (`ok`, what went
    /// wrong, or `unreadable: ...`); absent without a file sync client (open source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sync_status: Option<String>,
    /// File sync's own commit for this environment (not the control repository's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sync_commit: Option<String>,
}

impl CodeAnswer {
    /// Each deployment read, with its age at `now` (seconds since the epoch) and what file
    /// sync says of it.
    pub fn of(reading: &Reading, now: i64) -> Vec<Self> {
        reading
            .deployments
            .iter()
            .map(|d| {
                let mut answer = CodeAnswer {
                    environment: d.environment.clone(),
                    state: String::new(),
                    path: None,
                    commit: None,
                    started_at: None,
                    finished_at: None,
                    age_seconds: None,
                    why: None,
                    file_sync_status: None,
                    file_sync_commit: None,
                };
                match &reading.file_sync {
                    FileSync::Unreadable(why) => {
                        answer.file_sync_status = Some(format!("unreadable: {why}"));
                    }
                    sync => {
                        if let Some(synced) = sync.of(&d.environment) {
                            answer.file_sync_status =
                                Some(synced.status.clone().unwrap_or_else(|| "none".into()));
                            answer.file_sync_commit.clone_from(&synced.commit);
                        }
                    }
                }
                let shown = |p: &std::path::Path| Some(p.display().to_string());
                match &d.found {
                    Found::Record { path, record } => {
                        answer.state = match record.success {
                            Some(false) => "failed",
                            _ => "deployed",
                        }
                        .into();
                        answer.path = shown(path);
                        answer.commit.clone_from(&record.commit);
                        answer.started_at = record.started_at.map(expiry::timestamp);
                        answer.finished_at = record.finished_at.map(expiry::timestamp);
                        answer.age_seconds = record.finished_at.map(|t| now - t);
                    }
                    Found::NoEnvironment => answer.state = "no_environment".into(),
                    Found::NoRecord { path } => {
                        answer.state = "no_record".into();
                        answer.path = shown(path);
                    }
                    Found::Unreadable { path, why } => {
                        answer.state = "unreadable".into();
                        answer.path = shown(path);
                        answer.why = Some(why.clone());
                    }
                }
                answer
            })
            .collect()
    }
}

/// When the files Puppet's TLS rests on stop being valid ([`crate::puppet::expiry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertificatesAnswer {
    /// Every certificate of hostcert and localcacert.
    pub certs: Vec<CertAnswer>,
    /// The CRL, when one was read.
    pub crl: Option<CrlAnswer>,
    /// Files that could not be read, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

/// One certificate's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertAnswer {
    /// `hostcert` or `localcacert`.
    pub file: String,
    /// `leaf`, `intermediate` or `root`.
    pub position: String,
    /// `CN=...`.
    pub subject: String,
    /// `notAfter`, RFC 3339.
    pub not_after: String,
    /// Days until then (negative: past).
    pub days_left: f64,
}

/// The CRL's dates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrlAnswer {
    /// Its issuer.
    pub issuer: String,
    /// `thisUpdate`, RFC 3339.
    pub this_update: String,
    /// `nextUpdate`, RFC 3339, when it has one.
    pub next_update: Option<String>,
    /// Days until `nextUpdate` (negative: past).
    pub days_left: Option<f64>,
}

impl CertificatesAnswer {
    /// The dates read, with the days left at `now` (seconds since the epoch).
    pub fn of(e: &Expiries, now: i64) -> Self {
        let days = |end: i64| ((end - now) as f64 / 86_400.0 * 10.0).round() / 10.0;
        Self {
            certs: e
                .certs
                .iter()
                .map(|c| CertAnswer {
                    file: c.file.as_str().to_owned(),
                    position: c.position.as_str().to_owned(),
                    subject: c.subject.clone(),
                    not_after: expiry::timestamp(c.not_after),
                    days_left: days(c.not_after),
                })
                .collect(),
            crl: e.crl.as_ref().map(|c| CrlAnswer {
                issuer: c.issuer.clone(),
                this_update: expiry::timestamp(c.this_update),
                next_update: c.next_update.map(expiry::timestamp),
                days_left: c.next_update.map(days),
            }),
            unreadable: e.unreadable.clone(),
        }
    }
}

/// Polls that no poller entry holds ([`crate::responder::pollers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnrecordedAnswer {
    /// How many since the daemon started.
    pub polls: u64,
    /// How long ago the latest was.
    pub last_ms_ago: u64,
}

/// One address that polls, and what it was told ([`crate::responder::pollers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollerAnswer {
    /// Where its polls come from.
    pub address: IpAddr,
    /// How its latest poll proved that it comes from a load balancer; the waits, the
    /// last-server guard and `status` believe only a proven poller's word.
    pub proof: Proof,
    /// The key file's line of the key it proves itself with: one load balancer per key, so
    /// two at one address are told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_line: Option<usize>,
    /// How long ago its first remembered poll was.
    pub first_ms_ago: u64,
    /// How long ago its latest poll was.
    pub last_ms_ago: u64,
    /// How many polls it made since the first, of either kind.
    pub polls: u32,
    /// What its HTTP checks were told.
    pub http: Option<ToldAnswer>,
    /// What its agent checks were told.
    pub agent: Option<ToldAnswer>,
    /// It polls at a steady rhythm (a load balancer), as opposed to an address seen once or
    /// twice: an unproven poller is waited for only once regular.
    pub regular: bool,
    /// It still polls: silent for no longer than three of its own intervals between polls
    /// ([`crate::responder::server_line::polling`]). Whoever no longer polls is not waited for,
    /// and its word holds nothing.
    pub polling: bool,
    /// The client its latest HTTP poll named in `User-Agent` (`curl`); none for HAProxy, whose
    /// checks send no such header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The latest `X-Haproxy-Server-State` it sent (`http-check send-state`), one per server
    /// line it checks this node for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<StateAnswer>,
    /// How long ago the latest state header its checks stopped sending was sent: its later
    /// checks carry none (`http-check send-state` is gone from its backend), so that header
    /// is no longer its view, and is left out of `states`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub states_stopped_ms_ago: Option<u64>,
    /// How long ago its latest agent check was, when its agent checks fell silent while its
    /// HTTP checks went on (`agent-check` gone from its server line): what they were told is
    /// no longer its state, nor is the weight read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_stopped_ms_ago: Option<u64>,
}

impl PollerAnswer {
    /// What its agent checks were told, unless it stopped making them.
    pub fn agent_now(&self) -> Option<ToldAnswer> {
        self.agent.filter(|_| self.agent_stopped_ms_ago.is_none())
    }
}

/// One server line a load balancer checks this node for (its backend and server), as its
/// latest HTTP check's `X-Haproxy-Server-State` said. HAProxy writes the header before it
/// reads that check's answer: it shows the effect of the answers before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAnswer {
    /// How long ago it was sent.
    pub last_ms_ago: u64,
    /// What the check that carried it was answered.
    pub told: Verdict,
    /// How long ago this server line's checks began to be answered `told`, in a row.
    pub since_ms_ago: u64,
    /// The line is still checked: its header came within three of its own intervals.
    pub polling: bool,
    /// The check that carried it was answered as not drained although the node is: the
    /// drain was held at this line ([`crate::health::hold`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// What the drain rule meets at this line now: a drain whose every holder may be held is
    /// held here, for this reason. What `drain` and `cycle` ask before they write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<Held>,
    /// What this line's agent checks were told, when they name it (`agent-send`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<ToldAnswer>,
    /// The header as read; `None` when it was malformed.
    pub seen: Option<LbState>,
    /// Why the header was refused, if it was.
    pub malformed: Option<String>,
}

/// What one kind of check was told last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToldAnswer {
    /// The verdict of the latest answer.
    pub told: Verdict,
    /// How many answers in a row carried it.
    pub times: u32,
    /// How long ago the latest answer was.
    pub last_ms_ago: u64,
    /// How long ago the first answer of this run was.
    pub since_ms_ago: u64,
}

/// The established connections to Puppet Server's listener, without pmcheck's own probes;
/// bounded however many there are ([`crate::responder::agents`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficAnswer {
    /// The listener watched: the address pmcheck probes.
    pub listener: SocketAddr,
    /// The remote end of the first connections (for agents through HAProxy, HAProxy's
    /// address), at most [`crate::responder::agents::LISTED`].
    pub connections: Vec<SocketAddr>,
    /// How many connections there are.
    pub total: usize,
    /// Connections per source address, the busiest first, at most
    /// [`crate::responder::agents::SOURCES`].
    pub sources: Vec<SourceAnswer>,
    /// How many more source addresses there are.
    pub other_sources: usize,
    /// Why the connections cannot be read, if they cannot.
    pub problem: Option<String>,
    /// How long before the answer the tables were read (a read serves requests for
    /// [`crate::responder::agents::FRESH`]); `None` when they could not be.
    pub age_ms: Option<u64>,
}

/// How many connections come from one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceAnswer {
    /// The address.
    pub address: IpAddr,
    /// Its connections.
    pub connections: usize,
}

impl TrafficAnswer {
    /// The connections to `listener` cannot be read, because of `problem`.
    pub fn unreadable(listener: SocketAddr, problem: String) -> Self {
        Self {
            listener,
            connections: Vec::new(),
            total: 0,
            sources: Vec::new(),
            other_sources: 0,
            problem: Some(problem),
            age_ms: None,
        }
    }

    /// How many connections there are.
    pub fn count(&self) -> usize {
        self.total
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The poller table as the operator's JSON carries it.
impl Pollers {
    /// The list as the operator's JSON carries it.
    pub fn answer(&self, now: Instant) -> Vec<PollerAnswer> {
        let ago = |t: Instant| ms(now.saturating_duration_since(t));
        self.list(now)
            .into_iter()
            .map(|p| PollerAnswer {
                address: p.address,
                proof: p.proof,
                key_line: p.key_line,
                first_ms_ago: ago(p.first),
                last_ms_ago: ago(p.last),
                polls: p.polls,
                http: p.http.map(|t| t.answer(now)),
                agent: p.agent.map(|t| t.answer(now)),
                regular: p.regular(now),
                polling: p.polling(now),
                client: p.client.map(|c| c.as_str().to_owned()),
                agent_stopped_ms_ago: (p.agent)
                    .filter(|_| p.agent_stopped(now))
                    .map(|t| ago(t.last)),
                states_stopped_ms_ago: (p.lines.iter().flatten())
                    .filter(|l| p.stopped(l, now))
                    .map(|l| ago(l.at))
                    .min(),
                states: (p.lines.iter().flatten())
                    .filter(|l| !p.stopped(l, now))
                    .map(|l| {
                        let (seen, malformed) = match l.read() {
                            Ok(state) => (Some(state), None),
                            Err(e) => (None, Some(e.to_string())),
                        };
                        StateAnswer {
                            last_ms_ago: ago(l.at),
                            told: l.told,
                            since_ms_ago: ago(l.since),
                            polling: l.polling(now),
                            held: l.held,
                            holds: seen.as_ref().and_then(|lb| l.holds(lb, l.at, now)),
                            agent: l.agent.map(|t| t.answer(now)),
                            seen,
                            malformed,
                        }
                    })
                    .collect(),
            })
            .collect()
    }
}
