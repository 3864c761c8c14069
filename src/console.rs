//! The commands' words for the operator, on standard output and standard error.
//!
//! A reader that went away (`pmcheck drain | head -1`) ends the output, not the command: the
//! drain is written and the exit status is the command's own, as with any Unix tool, where
//! `println!` would panic (exit 101). The same holds for any other failed write: what the
//! command did matters more than its words about it.

use std::fmt;
use std::io::{self, Write};

/// Writes `args` to standard output.
pub fn to_stdout(args: fmt::Arguments<'_>) {
    write(&mut io::stdout().lock(), args);
}

/// Writes `args` to standard error.
pub fn to_stderr(args: fmt::Arguments<'_>) {
    write(&mut io::stderr().lock(), args);
}

fn write(w: &mut impl Write, args: fmt::Arguments<'_>) {
    // Nowhere is left to say that a write failed: the words are dropped, the work stands.
    let _ = w.write_fmt(args).and_then(|()| w.flush());
}

/// `print!` that survives a closed standard output ([`to_stdout`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::console::to_stdout(format_args!($($arg)*)) };
}

/// `println!` that survives a closed standard output ([`to_stdout`]).
macro_rules! outln {
    ($($arg:tt)*) => { $crate::console::to_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that survives a closed standard error ([`to_stderr`]).
macro_rules! errln {
    ($($arg:tt)*) => { $crate::console::to_stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
