//! The `wasmswitch` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wasmswitch::{bench, config::Config, daemon, demo};

#[derive(Parser)]
#[command(name = "wasmswitch", version, about = "A multi-queue AF_XDP software switch with WebAssembly policy plugins")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the switch until SIGINT/SIGTERM (SIGHUP reloads), then drain and exit.
    Run {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a config file (and its plugins); exit 0 or print a precise error.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Measure the sim datapath on one worker: Mpps, ns/packet, cycles/packet, loss.
    Bench(bench::BenchArgs),
    /// Build a lab (network namespaces on veth pairs), switch it through AF_XDP, ping across,
    /// print live per-port rates, then remove everything. Without root: the sim lab.
    Demo {
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        seconds: Option<u64>,
        /// Run the sim lab even as root.
        #[arg(long)]
        sim: bool,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config } => daemon::run(&config),
        Command::Check { config } => Config::load(&config).map_err(anyhow::Error::from).and_then(|c| {
            // Plugins are loaded, type-checked against the world and initialised with their config.
            let n: usize = c.ports.iter().map(|p| p.plugins.len()).sum();
            if n > 0 {
                let engine = wasmswitch::plugins::engine()?;
                wasmswitch::plugins::compile(&engine, &c)?;
            }
            println!("{}: ok ({} ports, {} workers, {n} plugins)", config.display(), c.ports.len(), c.workers.len());
            Ok(())
        }),
        Command::Bench(args) => args.options().and_then(|o| bench::run(&o)).map(|_| ()),
        Command::Demo { seconds, sim } => demo::run(seconds, sim),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
