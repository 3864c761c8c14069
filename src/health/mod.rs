//! The node's health as pure rules: the verdict made from the drain record and the latest
//! probe, the agent-check weight, the answer everyone reads, and what a load balancer says of
//! this node (`send-state`) and whether it proves it is one. Time comes in as an argument.

pub mod answer;
pub mod decision;
pub mod hold;
pub mod lb_state;
pub mod verdict;
pub mod weight;

use std::time::{Instant, SystemTime};

/// One moment, read once by the caller of a decision: the monotonic clock for the probe's age
/// and the weight's ramp, the wall clock for the drain record's dates. Nothing in `health`
/// reads a clock itself, so every rule here can be tested at any moment.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// For ages and ramps.
    pub at: Instant,
    /// For the drain record's times, which are wall-clock dates on disk.
    pub wall: SystemTime,
}
