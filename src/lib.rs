//! pmcheck: tells HAProxy whether this Puppet Server compile master may receive agent traffic.
//!
//! The daemon ([`server`]) answers polls ([`responder`]) from a [`verdict`] made of the drain
//! record ([`drain`], kept current by [`drain_watch`]) and the latest [`probe`] of the local
//! Puppet Server, which authenticates with the host's Puppet [`identity`] found through
//! [`puppet_conf`] and [`settings`]. Its listeners are guarded by an allowlist ([`cidr`]), a
//! connection table ([`connections`]) and write deadlines ([`deadline`]).

pub mod cli;
pub mod commands;
pub mod exit;
pub mod health;
pub mod operator;
pub mod puppet;
pub mod responder;
pub mod settings;
pub mod text;

pub use commands::run;
