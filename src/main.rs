//! Parses the command line and hands it to the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use pmcheck::cli::Cli;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = Cli::command()
        .try_get_matches_from(&args)
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    match parsed {
        Ok((cli, matches)) => ExitCode::from(pmcheck::run(cli, &matches)),
        Err(error) => {
            let _ = error.print();
            ExitCode::from(pmcheck::commands::usage_exit_code(&error, &args))
        }
    }
}
