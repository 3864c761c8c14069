//! The node's health: the drain record, kept current in the background, and the verdict made
//! from it and the latest probe; and what a load balancer says of this node (`send-state`).

pub mod answer;
pub mod decision;
pub mod drain;
pub mod drain_audit;
pub mod drain_file;
pub mod drain_gate;
pub mod drain_lock;
pub mod drain_log;
pub mod drain_watch;
pub mod holders;
pub mod lb_proof;
pub mod lb_state;
pub mod verdict;
pub mod weight;
