//! `pangea`: the operator's command. This file only parses flags; each command group
//! lives in its own module.

use clap::{Parser, Subcommand};

mod output;
mod store_cmd;

#[derive(Debug, Parser)]
#[command(
    name = "pangea",
    version,
    about = "Pangea: a multi-region replicated key-value serving layer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Offline tools for a replica's data directory (the replica must be stopped).
    #[command(subcommand)]
    Store(store_cmd::StoreCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Store(cmd) => store_cmd::run(cmd),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
