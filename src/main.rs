//! Parses the command line and hands it to the library.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use pmcheck::cli::Cli;
use pmcheck::exit::Exit;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = Cli::command()
        .try_get_matches_from(&args)
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    match parsed {
        Ok((cli, matches)) => pmcheck::run(cli, &matches).into(),
        Err(error) => {
            let _ = error.print();
            if let Some(hint) = pmcheck::cli::env_hint(&error, &args) {
                eprintln!("{hint}");
            }
            Exit::for_usage(&error, &args).into()
        }
    }
}
