//! pmcheck: tells HAProxy whether this Puppet Server compile master may receive agent traffic.
//!
//! The daemon ([`server`]) answers polls ([`responder`]) from a [`verdict`] made of the drain
//! record ([`drain`], kept current by [`drain_watch`]) and the latest [`probe`] of the local
//! Puppet Server, which authenticates with the host's Puppet [`identity`] found through
//! [`puppet_conf`] and [`settings`]. Its listeners are guarded by an allowlist ([`cidr`]), a
//! connection table ([`connections`]) and write deadlines ([`deadline`]).

pub mod cidr;
pub mod cli;
pub mod commands;
pub mod connections;
pub mod deadline;
pub mod drain;
pub mod drain_watch;
pub mod identity;
pub mod inetd;
pub mod manual;
pub mod probe;
pub mod puppet_conf;
pub mod responder;
pub mod server;
pub mod settings;
pub mod signals;
pub mod status;
pub mod systemd;
pub mod text;
pub mod verdict;

pub use commands::run;
