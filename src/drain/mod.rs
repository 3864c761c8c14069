//! The drain record and everything that keeps it: the record and its holders, the file and its
//! lock, the event log, and the daemon's watcher and auditor of both. Operators write it
//! (`pmcheck drain`), the daemon reads it; the verdict it feeds is [`crate::health`]'s.

pub mod audit;
pub mod file;
pub mod holders;
pub mod holding;
pub mod lock;
pub mod log;
pub mod record;
pub mod roll;
pub mod tenure;
pub mod watch;
