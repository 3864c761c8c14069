//! Parses the command line and hands it to the library.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use pmcheck::cli::Cli;
use pmcheck::exit::Exit;

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let parsed = Cli::command()
        .try_get_matches_from(&argv)
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    match parsed {
        Ok((cli, matches)) => pmcheck::run(cli, &matches, &argv).into(),
        Err(error) => {
            let _ = error.print();
            let args: Vec<String> = argv
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            if let Some(hint) = pmcheck::provenance::env_hint(&error, &args) {
                pmcheck::console::write(&mut std::io::stderr().lock(), format_args!("{hint}\n"));
            }
            Exit::for_usage(&error, &args).into()
        }
    }
}
