//! `wasmswitch-bench-native`: `wasmswitch bench` plus the `l2+native` scenario, the example
//! plugins' logic compiled natively and run through the same batch encoding as the Wasm stage,
//! so that `l2+plugin` against `l2+native` is what the Wasm boundary and codegen add. A
//! separate binary so that the daemon does not depend on the example plugins.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use wasmswitch::bench::{self, BenchArgs};
use wasmswitch_core::verdict::VerdictStage;
use wasmswitch_plugin_host::NativeStage;

#[derive(Parser)]
#[command(
    name = "wasmswitch-bench-native",
    version,
    about = "`wasmswitch bench` with l2+native: the example plugin given by --plugin, also compiled natively"
)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

/// The example plugins compiled into this binary, for the `l2+native` comparison.
const NATIVE_PLUGINS: &[&str] = &["acl", "ratelimit", "port-security", "sampler"];

/// The [`bench::NativeFactory`]: the example plugin named like the `--plugin` file.
fn native_stage(name: &str, config: &str, header_bytes: u16) -> Result<Box<dyn VerdictStage>> {
    let e = |m: String| anyhow::anyhow!("native {name}: init refused the config: {m}");
    Ok(match name {
        "acl" => Box::new(NativeStage::<acl::Acl>::new(config, header_bytes).map_err(e)?),
        "ratelimit" => Box::new(NativeStage::<ratelimit::RateLimit>::new(config, header_bytes).map_err(e)?),
        "port-security" => Box::new(NativeStage::<port_security::PortSecurity>::new(config, header_bytes).map_err(e)?),
        "sampler" => Box::new(NativeStage::<sampler::Sampler>::new(config, header_bytes).map_err(e)?),
        _ => bail!(
            "no native build of `{name}`: l2+native exists for the example plugins ({})",
            NATIVE_PLUGINS.join(", ")
        ),
    })
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.bench.options().and_then(|o| bench::run_with(&o, Some(native_stage))) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
