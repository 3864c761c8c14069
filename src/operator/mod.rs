//! What the operator runs and reads: `pmcheck status`, the waits of `drain --wait` and
//! `undrain --wait`, `pmcheck cycle`, and the manual.

pub mod assessment;
pub mod cycle;
pub mod daemon;
pub mod manual;
pub mod status;
pub mod wait;
