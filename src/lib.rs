//! pmcheck: tells HAProxy whether this Puppet Server compile master may receive agent traffic.
//!
//! The layers, each importing only the ones below it: [`cli`] and [`commands`] (the command
//! line), `operator` (what a person runs: `status`, the waits, `cycle`), [`responder`] (the
//! daemon and its listeners), [`protocol`] (`/status` as both read it), [`health`] (the pure decision and verdict), [`drain`] (the drain
//! record, its file, log and watcher), [`puppet`] (this host's identity, the probe, the pool),
//! [`settings`], and at the bottom [`exit`], the file stamp and text helpers.
//!
//! One poll, from socket to verdict:
//!
//! ```text
//! commands::run    argv, flags + env -> provenance::Provenance -> settings::Given
//!                  Given + puppet.conf + webserver.conf -> settings::Settings  (once, at start;
//!                  its `daemon` part holds every `serve` option, as `pmcheck config` shows)
//! responder::server::serve(&Settings)
//!   background     drain::watch::run  drain record (inotify, a --for's end, SIGHUP) -> Feeds.drain
//!                  drain::audit::run  the event log, on the state directory's changes
//!                  probe::run         Prober (TLS as this host) every interval -> Feeds.latest
//!                  track_rejoin       Decision on each change -> Feeds.rejoin, verdict log
//!                  reading::refresh   certificate dates every minute, deploy records every
//!                                     10 s and PE file sync (the prober's PuppetClient) -> Readings
//!   per listener   listener::run      accept -> --allow -> Connections::admit (may shed one)
//!   per poll       node::Node::decide(Feeds, node::now()) -> health::decision::Decision
//!                  http: Node::answer -> 200/503 (or 404 drained) + reason, text or JSON;
//!                  /status (the operator's JSON), /metrics (Prometheus)
//!                  agent: agent::line -> "up ready 80% #OK - ..." then close
//! ```
//!
//! One drain, from the operator to the load balancer:
//!
//! ```text
//! pmcheck drain    operator::drain::drain -> operator::guard::take (asks the daemon: would a
//!                  load balancer hold it?) -> DrainFile::update under flock:
//!                  DrainRecord::held_by(holders) written atomically
//! daemon           drain::watch sees it -> Feeds.drain -> every next poll answers DRAINED
//! --wait           operator::wait::wait asks the daemon's /status (Daemon::asking) every 250 ms;
//!                  the daemon's responder::progress decides where the drain stands: each load
//!                  balancer's own X-Haproxy-Server-State, else what it was told; agent
//!                  connections; JRubies; the wait renders it (protocol::progress)
//! ```
//!
//! - [`settings`] resolves what was given over puppet.conf over defaults, each value with its
//!   source ([`settings::Given`], [`settings::Settings`], [`settings::Daemon`]).
//! - [`puppet`] holds this host's TLS identity and the [`puppet::probe`] of Puppet Server's
//!   status API, whose [`puppet::report::ProbeOutcome`] is healthy (with the load of the
//!   [`puppet::pool::Pool`]), not ready, unhealthy (with a [`puppet::probe_error::ProbeError`])
//!   or cannot tell.
//! - [`drain`] keeps the drain record current off the poll path; [`health`] decides the
//!   [`health::verdict::Verdict`] ([`health::decision::Decision`]) and the agent-check
//!   [`health::weight`]; [`health::answer::Answer`] is the JSON body everyone reads.
//! - [`responder`] answers polls: the node's shared state ([`responder::node::Node`]), the
//!   daemon's listeners and their guards, the HTTP answers, HAProxy's agent check, inetd mode
//!   and systemd integration.
//! - [`commands`] dispatches the command line ([`cli`]) and turns errors into an
//!   [`exit::Exit`]; [`provenance`] turns it into settings, each with where it came from.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod accounts;
pub mod cli;
pub mod commands;
pub mod console;
pub mod drain;
pub mod exit;
pub mod file_stamp;
pub mod health;
pub mod logging;
pub(crate) mod operator;
pub mod protocol;
pub mod provenance;
pub mod puppet;
pub mod reading;
pub mod responder;
pub mod safe_file;
pub mod settings;
pub(crate) mod systemd;
pub(crate) mod text;

pub use commands::run;
