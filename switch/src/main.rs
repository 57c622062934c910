//! The `wasmswitch` command.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wasmswitch::client::{self, Ask, Target};
use wasmswitch::error_text::ErrorText;
use wasmswitch::{bench, daemon, demo, plugin_cmd};

#[derive(Parser)]
#[command(name = "wasmswitch", version, about = "A multi-queue AF_XDP software switch with WebAssembly policy plugins")]
struct Cli {
    /// Log lines as text or as one JSON object per line (for a log shipper).
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// How the client commands find a running daemon.
#[derive(clap::Args)]
struct ClientArgs {
    /// The daemon's config file: its `metrics.listen` and `control.token_file` are used.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// The daemon's address (default: from `-c`, else 127.0.0.1:9187).
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// A file holding the API token (default: `control.token_file` of `-c`).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the switch until SIGINT/SIGTERM (SIGHUP reloads), then drain and exit.
    Run {
        /// The YAML config file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Validate a config file and its plugins (each is run on built-in test frames); exit 0 or
    /// print a precise error.
    Check {
        #[arg(short, long)]
        config: PathBuf,
        /// Only load and initialise the plugins; do not run them on the built-in test frames.
        #[arg(long)]
        no_smoke: bool,
    },
    /// Measure the sim datapath (one worker, or --workers N): Mpps, ns/packet, cycles/packet, loss.
    Bench(bench::BenchArgs),
    /// Ask a running daemon whether it is healthy, with its ports.
    Status(ClientArgs),
    /// A running daemon's ports and their counters.
    Ports(ClientArgs),
    /// A running daemon's MAC table: show it (the default), add or delete static entries, flush.
    Fdb {
        #[command(subcommand)]
        action: Option<FdbAction>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// A running daemon's plugins and their counters.
    Plugins(ClientArgs),
    /// A running daemon's shadow chains: show their verdict matrices (the default), promote
    /// one to live or discard it.
    Shadow {
        #[command(subcommand)]
        action: Option<ShadowAction>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Make a running daemon re-read its config (applied, or refused naming each key).
    Reload(ClientArgs),
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
    /// A plugin in its own crate: scaffold one, build it into a checked component.
    Plugin {
        #[command(subcommand)]
        action: PluginAction,
    },
}

#[derive(Subcommand)]
enum PluginAction {
    /// Create a plugin crate in DIR/NAME, ready for `cargo test` and `plugin build`.
    ///
    /// It holds a small working plugin (drops UDP to the port of its `dport=N` config and counts
    /// it), a native test through the SDK's harness, the example plugins' release profile and a
    /// README with the commands. The SDK is not published: the crate depends on the plugins/sdk
    /// of the checkout this binary was built from, by path (--sdk picks another). A folder that
    /// exists and is not empty is refused.
    New(plugin_cmd::NewArgs),
    /// Build a plugin crate into a checked component (DIR/<crate name>.wasm).
    ///
    /// Runs cargo for wasm32-unknown-unknown (an installed rustup target, else Debian's
    /// rustc-web + rust-web-src + lld-19 with -Zbuild-std, as plugins/build.sh does), wraps the
    /// core module into a component of the wasmswitch:plugin world, then loads it with the
    /// plugin host as `wasmswitch check` would, `init` getting --config: a missing export, a
    /// forbidden import or a refused config fails the build. The output is written only once it
    /// passed; the last line printed is its path and size.
    Build(plugin_cmd::BuildArgs),
}

#[derive(Subcommand)]
enum FdbAction {
    /// Every entry (or those every filter given selects): VLAN, MAC, port, age (or `static`).
    /// Pages through the table, printing each page as it comes.
    Show {
        /// Only the entries of this port.
        #[arg(long)]
        port: Option<String>,
        /// Only the entries of this VLAN.
        #[arg(long)]
        vlan: Option<u16>,
        /// Only the MACs that begin with these bytes, e.g. 02:00:5e.
        #[arg(long)]
        mac: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Add a static entry (never aged or moved; replaces a learned one).
    Add {
        /// The station's MAC address, e.g. 02:00:00:00:00:01.
        mac: String,
        #[arg(long, default_value_t = 1)]
        vlan: u16,
        /// The port it is behind.
        #[arg(long)]
        port: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete the entry of a MAC in a VLAN, static or learned.
    Del {
        mac: String,
        #[arg(long, default_value_t = 1)]
        vlan: u16,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Forget learned entries: all, or those of a port and/or VLAN.
    Flush {
        #[arg(long)]
        port: Option<String>,
        #[arg(long)]
        vlan: Option<u16>,
        /// Static entries too.
        #[arg(long = "static")]
        statics: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand)]
enum ShadowAction {
    /// Each port's live and shadow chains and how their verdicts compare (live × shadow).
    Show(ClientArgs),
    /// Make a port's shadow chain its live chain, between two batches (no frame lost).
    Promote {
        port: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a port's shadow chain; the live chain stays.
    Discard {
        port: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut logger = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if let LogFormat::Json = cli.log_format {
        logger.format(|buf, r| {
            let line = serde_json::json!({
                "ts": buf.timestamp_millis().to_string(),
                "level": r.level().as_str(),
                "target": r.target(),
                "msg": r.args().to_string(),
            });
            writeln!(buf, "{line}")
        });
    }
    logger.init();
    // Rust ignores SIGPIPE, so `wasmswitch fdb | head -1` would panic on its next line. A
    // command that only prints dies quietly on a closed pipe, as Unix tools do; `run` and
    // `demo` keep ignoring it (a closed log pipe must not kill a switch, or skip a lab's
    // cleanup).
    if !matches!(cli.command, Command::Run { .. } | Command::Demo { .. }) {
        // SAFETY: restores the default disposition of one signal before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let ask = |a: ClientArgs, ask: Ask| {
        Target::new(a.config.as_deref(), a.addr, a.token_file.as_deref()).and_then(|t| client::run(&t, ask, a.json))
    };
    let result = match cli.command {
        Command::Run { config } => daemon::run(&config),
        Command::Check { config, no_smoke } => wasmswitch::check::run(&config, no_smoke),
        Command::Bench(args) => args.options().and_then(|o| bench::run(&o)).map(|_| ()),
        Command::Demo { seconds, sim } => demo::run(seconds, sim),
        Command::Status(a) => ask(a, Ask::Status),
        Command::Ports(a) => ask(a, Ask::Ports),
        Command::Fdb { action, client } => match action {
            None => ask(client, Ask::Fdb { port: None, vlan: None, mac: None }),
            Some(FdbAction::Show { port, vlan, mac, client }) => ask(client, Ask::Fdb { port, vlan, mac }),
            Some(FdbAction::Add { mac, vlan, port, client }) => ask(client, Ask::FdbAdd { mac, vlan, port }),
            Some(FdbAction::Del { mac, vlan, client }) => ask(client, Ask::FdbDel { mac, vlan }),
            Some(FdbAction::Flush { port, vlan, statics, client }) => {
                ask(client, Ask::FdbFlush { port, vlan, statics })
            }
        },
        Command::Plugins(a) => ask(a, Ask::Plugins),
        Command::Shadow { action, client } => match action {
            None => ask(client, Ask::Shadow),
            Some(ShadowAction::Show(a)) => ask(a, Ask::Shadow),
            Some(ShadowAction::Promote { port, client }) => ask(client, Ask::ShadowChange { port, promote: true }),
            Some(ShadowAction::Discard { port, client }) => ask(client, Ask::ShadowChange { port, promote: false }),
        },
        Command::Reload(a) => ask(a, Ask::Reload),
        Command::Plugin { action: PluginAction::New(a) } => plugin_cmd::new(&a).map(|_| ()),
        Command::Plugin { action: PluginAction::Build(a) } => plugin_cmd::build(&a).map(|_| ()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", ErrorText(&e));
            ExitCode::FAILURE
        }
    }
}
