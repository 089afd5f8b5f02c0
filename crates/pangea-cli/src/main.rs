//! `pangea`: the operator's command. This file only parses flags; each command group
//! lives in its own module.

use clap::{Parser, Subcommand};

mod output;
mod store_cmd;
mod topology_cmd;

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
    /// Check, plan and compare topology and placement files.
    #[command(subcommand)]
    Topology(topology_cmd::TopologyCommand),
}

/// Output piped into `head` and the like: a closed pipe ends the command quietly,
/// as it would for any Unix tool, instead of a panic from `println!`.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141); // 128 + SIGPIPE, what a shell reports
        }
        default(info);
    }));
}

fn main() -> std::process::ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Store(cmd) => store_cmd::run(cmd),
        Command::Topology(cmd) => topology_cmd::run(cmd),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
