//! pmcheck: tells HAProxy whether this Puppet Server compile master may receive agent traffic.
//!
//! The daemon ([`server`]) answers polls ([`responder`]) from a [`verdict`] made of the drain
//! record ([`drain`]) and the latest [`probe`] of the local Puppet Server, which authenticates
//! with the host's Puppet [`identity`] found through [`puppet_conf`] and [`settings`].

pub mod cli;
pub mod commands;
pub mod drain;
pub mod identity;
pub mod inetd;
pub mod manual;
pub mod probe;
pub mod puppet_conf;
pub mod responder;
pub mod server;
pub mod settings;
pub mod status;
pub mod systemd;
pub mod verdict;

pub use commands::run;
