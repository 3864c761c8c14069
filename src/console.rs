//! The commands' words for the operator, on standard output and standard error.
//!
//! A reader that went away (`pmcheck drain | head -1`) ends the output, not the command: the
//! drain is written and the exit status is the command's own, as with any Unix tool, where
//! `println!` would panic (exit 101). The same holds for any other failed write: what the
//! command did matters more than its words about it.

use std::fmt;
use std::io::Write;

/// Writes `args` to `w`, a locked standard output or error, and flushes it.
pub fn write(w: &mut impl Write, args: fmt::Arguments<'_>) {
    // Nowhere is left to say that a write failed: the words are dropped, the work stands.
    let _ = w.write_fmt(args).and_then(|()| w.flush());
}

/// `print!` that survives a closed standard output ([`write()`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::console::write(&mut std::io::stdout().lock(), format_args!($($arg)*)) };
}

/// `println!` that survives a closed standard output ([`write()`]).
macro_rules! outln {
    ($($arg:tt)*) => { $crate::console::out!("{}\n", format_args!($($arg)*)) };
}

/// `eprintln!` that survives a closed standard error ([`write()`]).
macro_rules! errln {
    ($($arg:tt)*) => { $crate::console::write(&mut std::io::stderr().lock(), format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
