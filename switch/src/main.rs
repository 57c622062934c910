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
    Bench {
        /// One JSON object per scenario per line.
        #[arg(long)]
        json: bool,
        /// Scenario(s) to run (default: all): passthrough, l2, l2-single-return, l2-no-recycle.
        #[arg(long = "scenario")]
        scenarios: Vec<String>,
        /// Measured seconds per scenario (after a 0.2 s warm-up).
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Frame size in bytes.
        #[arg(long, default_value_t = 64)]
        frame_size: usize,
        /// Run the scenarios this many times, interleaved, and report each one's best run (the
        /// ratios then compare runs made close together on a noisy machine).
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// A plugin component: adds `l2+plugin` (l2 with it on every port's ingress) and, for
        /// the example plugins, `l2+native` (the same logic compiled natively).
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// File whose text is the plugin's config (handed to `init`).
        #[arg(long, requires = "plugin")]
        plugin_config: Option<PathBuf>,
        /// Header bytes the plugin sees per packet.
        #[arg(long, default_value_t = 64)]
        header_bytes: u16,
    },
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
        Command::Bench { json, scenarios, seconds, frame_size, rounds, plugin, plugin_config, header_bytes } => {
            (|| {
                let plugin = match plugin {
                    Some(path) => {
                        let config = match plugin_config {
                            Some(f) => std::fs::read_to_string(&f)
                                .map_err(|e| anyhow::anyhow!("--plugin-config {}: {e}", f.display()))?,
                            None => String::new(),
                        };
                        Some(bench::PluginBench::new(path, config, header_bytes))
                    }
                    None => None,
                };
                bench::run(&bench::BenchOptions { json, scenarios, seconds, frame_size, rounds, plugin }).map(|_| ())
            })()
        }
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
