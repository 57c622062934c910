//! `wasmswitch check`: the config's own checks, warnings about what `run` on this machine would
//! find, and the smoke run, in which each compiled plugin classifies the plugin host's
//! built-in frames ([`wasmswitch_plugin_host::smoke_frames`]) as packets of its port, under its
//! own limits, before the config is called good.

use std::path::Path;

use anyhow::{anyhow, Result};

use crate::config::Config;
use crate::plugins::CompiledChains;
use wasmswitch_core::PortId;

/// Checks the config at `config`: an error for what `run` anywhere would refuse, a warning for
/// what `run` on this machine would (the config may be for another), then the plugins (built,
/// type-checked against the world, initialised with their config and, unless `no_smoke`, run
/// on the built-in frames). Prints `ok` with what it counted.
pub fn run(config: &Path, no_smoke: bool) -> Result<()> {
    let c = Config::load(config)?;
    // The config may be for another machine, so not an error; but say what `run` here
    // would refuse.
    for p in &c.ports {
        if let Some(a) = &p.afxdp {
            let i = &a.value.interface.value;
            if wasmswitch_sys::ifindex(i).is_none() {
                eprintln!(
                    "warning: port `{}`: interface {i} does not exist here, so `run` on this machine would refuse it",
                    p.name.value
                );
            }
        }
    }
    for w in c.traffic_filtered_warnings().into_iter().chain(c.interface_warnings()) {
        eprintln!("warning: {w}");
    }
    // An existing TAP passes the config's checks (a reload validates the file while its
    // daemon holds the TAP), but a new `run` refuses it.
    if let Some(h) = &c.host {
        if wasmswitch_sys::ifindex(&h.tap.value).is_some() {
            eprintln!(
                "warning: host.tap {} exists on this machine, so a new `run` here would refuse it (the daemon of this config may be holding it: a reload keeps it)",
                h.tap.value
            );
        }
    }
    // The metrics and API address: its IP on a port of the kernel's choosing, so that a
    // daemon already on the address (this config's own, say) does not fail the probe.
    let listen = c.listen_addr();
    if let Err(e) = std::net::TcpListener::bind((listen.ip(), 0)) {
        if e.kind() == std::io::ErrorKind::AddrNotAvailable {
            eprintln!(
                "warning: metrics.listen {listen}: this machine has no address {} ({e}), so `run` on this machine would refuse it",
                listen.ip()
            );
        }
    }
    // Plugins are loaded, type-checked against the world and initialised with their
    // config, then (unless --no-smoke) run on the built-in test frames.
    let n: usize = c.ports.iter().map(|p| p.plugins.len() + p.shadow.len()).sum();
    if n > 0 {
        let engine = crate::plugins::engine()?;
        let chains = crate::plugins::compile(&engine, &c)?;
        if !no_smoke {
            let smoke = smoke(&c, &chains);
            smoke.ok.iter().for_each(|l| println!("{l}"));
            smoke.warnings.iter().for_each(|w| eprintln!("warning: {w}"));
            smoke.result()?;
        }
    }
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    println!(
        "{}: ok ({}, {}, {})",
        config.display(),
        count(c.ports.len(), "port"),
        count(c.workers.len(), "worker"),
        count(n, "plugin")
    );
    Ok(())
}

/// What the smoke run found, one line each: plugins that passed (with their verdicts),
/// warnings that do not fail the check, and faults that do.
#[derive(Debug, Default)]
pub struct Smoke {
    /// One line per plugin that passed: its verdicts on the test frames and its timing.
    pub ok: Vec<String>,
    /// What does not fail the check: a shadow plugin's fault, a redirect to a port the config
    /// lacks, `host` verdicts without a host port, a batch that used half its deadline.
    pub warnings: Vec<String>,
    /// A live plugin's fault each: the port, the plugin, the frame and why.
    pub faults: Vec<String>,
}

impl Smoke {
    /// `Err` when a plugin faulted: that fault's line, or with several, all of them.
    pub fn result(&self) -> Result<()> {
        match self.faults.as_slice() {
            [] => Ok(()),
            [one] => Err(anyhow!("{one}")),
            all => Err(anyhow!("{} plugins failed the smoke run:\n  {}", all.len(), all.join("\n  "))),
        }
    }
}

/// Runs every plugin of `chains` (compiled from `cfg`), live and shadow, over the built-in
/// frames; all of them, so one check names every plugin that faults. A fault names the port,
/// the plugin, the frame and why; a shadow plugin's fault is a warning. A redirect to a port the
/// config does not have is a warning: the switch would drop those packets (`bad_redirect`),
/// which may be what a plugin written for another config does; so is a `host` or `host-copy`
/// verdict in a config without a host port; so is a plugin whose costliest batch of
/// `switch.batch` test frames used half its deadline or more.
pub fn smoke(cfg: &Config, chains: &CompiledChains) -> Smoke {
    let mut out = Smoke::default();
    // Ports a redirect may name: the configured ones, then the host port.
    let ports = cfg.ports.len() + usize::from(cfg.host.is_some());
    for (index, (port, chains)) in cfg.ports.iter().zip(&chains.chains).enumerate() {
        let live = format!("port `{}`", port.name.value);
        let shadow = format!("{live} (shadow chain)");
        let all = chains.live.iter().map(|f| (&live, f, false)).chain(chains.shadow.iter().map(|f| (&shadow, f, true)));
        for (at, f, is_shadow) in all {
            let name = &f.spec().name;
            let report = match f.smoke_batch(PortId::from_index(index), cfg.switch.batch.value) {
                Ok(r) => r,
                // A shadow plugin's verdicts are never applied, so its fault costs traffic
                // nothing: a warning (it is what a shadow run is there to show, and a candidate
                // may be put in shadow precisely because it is suspect).
                Err(e) if is_shadow => {
                    out.warnings.push(format!("{at}: {e} (its verdicts are never applied)"));
                    continue;
                }
                Err(e) => {
                    out.faults.push(format!("{at}: {e}"));
                    continue;
                }
            };
            for (frame, to) in &report.redirects {
                if to.index() >= ports {
                    out.warnings.push(format!(
                        "{at}, plugin `{name}`: redirects `{frame}` to port {to}, but the config has ports 0-{} (the switch drops such packets as bad_redirect)",
                        ports.saturating_sub(1)
                    ));
                }
            }
            // Without a host port: `host` frames are dropped (no_egress), `host_copy` ones
            // forward without their copy.
            if cfg.host.is_none() && report.host + report.host_copy > 0 {
                out.warnings.push(format!(
                    "{at}, plugin `{name}`: answers `host` or `host-copy` ({} and {} of the test frames), but the config has no host port: the switch drops `host` packets (no_egress) and forwards `host-copy` ones without a copy",
                    report.host, report.host_copy
                ));
            }
            if let Some(w) = report.near_deadline() {
                out.warnings.push(format!("{at}, plugin `{name}`: {w}"));
            }
            out.ok.push(format!("{at}, plugin `{name}`: {report}; {}", report.timing()));
        }
    }
    out
}
