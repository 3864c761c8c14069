//! Placeholder: the flood benchmark is being written.
fn main() {}
