//! What the operator reads: `pmcheck status` and the manual.

pub mod manual;
pub mod status;
