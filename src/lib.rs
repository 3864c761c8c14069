//! pmcheck: tells HAProxy whether this Puppet Server compile master may receive agent traffic.
//!
//! One poll, from socket to verdict:
//!
//! ```text
//! settings   flags, env, puppet.conf, webserver.conf -> Settings            (once, at start)
//! puppet     identity files -> Prober -> ProbeReport { outcome, pool }      (once per interval)
//! health     drain record (watched) + latest ProbeReport + Rejoin -> Decision { verdict, weight }
//!                                                                           (per poll, no I/O)
//! responder  Decision -> Answer -> text or JSON, 200/503 + reason; or one agent-check line
//! ```
//!
//! - [`settings`] resolves what was given over puppet.conf over defaults, each value with its
//!   source ([`settings::Given`], [`settings::Settings`]).
//! - [`puppet`] holds this host's TLS identity and the [`puppet::probe`] of Puppet Server's
//!   status API, whose [`puppet::probe::ProbeOutcome`] is healthy (with the load of the
//!   [`puppet::pool::Pool`]), not ready, unhealthy (with a [`puppet::probe::ProbeError`]) or
//!   cannot tell.
//! - [`health`] keeps the drain record current off the poll path and decides the
//!   [`health::verdict::Verdict`] and the agent-check [`health::weight`];
//!   [`health::answer::Answer`] is the JSON body everyone reads.
//! - [`responder`] answers polls: the daemon's listeners and their guards, the HTTP
//!   [`responder::http::Responder`], HAProxy's agent check, inetd mode and systemd integration.
//! - [`commands`] is the only place that turns the command line ([`cli`]) into settings, and
//!   errors into an [`exit::Exit`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod commands;
pub mod exit;
pub mod file_stamp;
pub mod health;
pub(crate) mod operator;
pub mod puppet;
pub mod responder;
pub mod settings;
pub(crate) mod text;

pub use commands::run;
