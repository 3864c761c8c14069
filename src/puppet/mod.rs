//! The local Puppet Server, as this host sees it: its TLS identity, the probe, and the agent
//! connections it serves.

pub mod client;
pub mod code;
pub mod expiry;
pub mod file_sync;
pub mod identity;
pub mod pause;
pub mod pool;
pub mod probe;
pub mod probe_error;
pub mod readings;
pub mod report;
pub mod status_api;
pub mod timestamp;
pub mod traffic;
pub mod wedge;
