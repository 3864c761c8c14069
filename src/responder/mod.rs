//! Answering polls: the daemon's listeners and their guards, the HTTP responder and its
//! Prometheus metrics, inetd mode and systemd's socket activation and notifications.

pub mod agent;
pub mod agents;
pub(crate) mod bind;
pub mod client_name;
pub(crate) mod connections;
pub(crate) mod deadline;
pub(crate) mod exposition;
pub mod heartbeat;
pub mod http;
pub(crate) mod inetd;
pub(crate) mod key_reload;
pub(crate) mod listener;
pub mod metrics;
pub mod node;
pub mod pollers;
pub mod progress;
pub(crate) mod puppet_files;
pub(crate) mod ramp_record;
pub(crate) mod server;
pub mod server_line;
pub(crate) mod signals;
pub(crate) mod status;
pub(crate) mod throttle;
pub(crate) mod unproven;
pub(crate) mod verdict_log;
