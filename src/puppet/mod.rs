//! The local Puppet Server, as this host sees it: its TLS identity and the probe.

pub mod identity;
pub mod pool;
pub mod probe;
