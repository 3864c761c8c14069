//! Answering polls: the daemon's listeners and their guards, the HTTP responder, inetd mode and
//! systemd's socket activation and notifications.

pub mod cidr;
pub mod connections;
pub mod deadline;
pub mod http;
pub mod inetd;
pub mod server;
pub mod signals;
pub mod systemd;
