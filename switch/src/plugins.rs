//! Plugin chains: YAML → compiled plugins (off the data path) → one chain stage per port per
//! worker, swapped in at a batch boundary on reload.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use prometheus_client::encoding::DescriptorEncoder;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_core::{PortId, BATCH_SIZE};
use wasmswitch_plugin_host::{
    EngineOptions, FaultReason, OnError, PluginEngine, PluginFactory, PluginSpec, PluginStats, WasmStage,
};

use crate::config::{self, Config, PluginSection};
use crate::metrics::{counter_family, gauge_family, MetricsSource};

/// The host's view of a plugin section.
pub fn spec(s: &PluginSection) -> PluginSpec {
    PluginSpec {
        name: s.name.value.clone(),
        path: s.file.clone(),
        config: s.config.clone(),
        header_bytes: s.header_bytes.value,
        on_error: match s.on_error {
            config::OnError::Pass => OnError::Pass,
            config::OnError::Drop => OnError::Drop,
        },
        deadline: Duration::from_micros(s.deadline_us.value),
        memory_limit: s.memory_limit_kib.value * 1024,
        max_faults: s.max_faults.value.max(1),
    }
}

/// Every configured port's compiled chain (index = the port's place in the config; empty for
/// ports without plugins).
pub struct CompiledChains {
    pub chains: Vec<Vec<Arc<PluginFactory>>>,
}

/// One engine per process: compiled code is cached under `$XDG_CACHE_HOME` (or /var/cache)
/// so a restart does not recompile.
pub fn engine() -> Result<Arc<PluginEngine>> {
    let cache = std::env::var_os("WASMSWITCH_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| Path::new(&d).join("wasmswitch")))
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/wasmswitch")));
    PluginEngine::new(EngineOptions { cache_dir: cache, ..EngineOptions::default() })
        .map_err(|e| anyhow::anyhow!("cannot start the plugin engine: {e}"))
}

/// Compiles (or loads from cache) and initialises every plugin of `cfg`; the first error names
/// the port and plugin.
pub fn compile(engine: &Arc<PluginEngine>, cfg: &Config) -> Result<CompiledChains> {
    let mut chains = Vec::new();
    for port in &cfg.ports {
        let mut chain = Vec::new();
        for s in &port.plugins {
            let f = engine.compile(&spec(s)).map_err(|e| anyhow::anyhow!("port `{}`: {e}", port.name.value))?;
            chain.push(f);
        }
        chains.push(chain);
    }
    Ok(CompiledChains { chains })
}

/// Ready stages for every port, by worker: `stages[w]` = (port id, stage) pairs.
pub type Stages = Vec<Vec<(PortId, Option<Box<dyn VerdictStage>>)>>;

/// The one plugin-install path, for start and reload: compiles `cfg`'s plugins (off the data
/// path; no engine at all when there are none) and instantiates every worker's stage for every
/// configured port, addressed by id through `id_of`. Ports without plugins get `None`, which
/// clears a chain a reload took away. The counters of the new stages are in the table; a
/// plugin whose (port, plugin name, worker) is in `carried` (the running stages' table, on
/// reload) keeps counting into those counters, so they never go backwards.
pub fn stages(
    cfg: &Config,
    id_of: &dyn Fn(&str) -> Option<PortId>,
    carried: &StatsTable,
) -> Result<(Stages, StatsTable)> {
    let workers = cfg.workers.len();
    let mut table = Vec::new();
    let mut carried: Carried = carried.iter().map(|(p, n, w, s)| ((p.clone(), n.clone(), *w), s.clone())).collect();
    let chains = if cfg.ports.iter().any(|p| !p.plugins.is_empty()) { Some(compile(&engine()?, cfg)?) } else { None };
    let mut stages: Stages = (0..workers).map(|_| Vec::new()).collect();
    for (w, out) in stages.iter_mut().enumerate() {
        for (index, port) in cfg.ports.iter().enumerate() {
            let name = &port.name.value;
            let id = id_of(name).with_context(|| format!("port `{name}` has no id"))?;
            let stage = match &chains {
                Some(c) => c.instantiate(w, index, name, &mut table, &mut carried)?,
                None => None,
            };
            out.push((id, stage));
        }
    }
    if chains.is_some() {
        log::info!(
            "plugins loaded: {}",
            cfg.ports
                .iter()
                .flat_map(|p| p.plugins.iter().map(|x| x.name.value.clone()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok((stages, table))
}

/// A port's plugins run in order on the whole batch; the first non-`pass` verdict a packet
/// gets decides it. One call per plugin per batch.
pub struct ChainStage {
    stages: Vec<WasmStage>,
    scratch: [Verdict; BATCH_SIZE],
}

impl VerdictStage for ChainStage {
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        let n = verdicts.len();
        let (first, rest) = match self.stages.split_first_mut() {
            Some(x) => x,
            None => return,
        };
        first.run(batch, verdicts);
        for stage in rest {
            self.scratch[..n].fill(Verdict::Pass);
            stage.run(batch, &mut self.scratch[..n]);
            for (v, s) in verdicts.iter_mut().zip(&self.scratch[..n]) {
                if *v == Verdict::Pass {
                    *v = *s;
                }
            }
        }
    }
}

/// Per-worker plugin counters, for the metrics collector: (port, plugin, worker, stats).
pub type StatsTable = Vec<(String, String, usize, Arc<PluginStats>)>;

/// The running stages' counters by (port, plugin, worker), taken by the reload's stages.
pub type Carried = HashMap<(String, String, usize), Arc<PluginStats>>;

impl CompiledChains {
    /// Worker `w`'s stage for configured port `index` (None when it has no plugins); the
    /// plugins' counters are added to `table`. A plugin found in `carried` takes those
    /// counters (each entry once: the worker that owns them is the only writer, and the
    /// old stage stops running when this one is installed on the same worker).
    pub fn instantiate(
        &self,
        w: usize,
        index: usize,
        port_name: &str,
        table: &mut StatsTable,
        carried: &mut Carried,
    ) -> Result<Option<Box<dyn VerdictStage>>> {
        let Some(chain) = self.chains.get(index).filter(|c| !c.is_empty()) else { return Ok(None) };
        let mut stages = Vec::new();
        for f in chain {
            let st = match carried.remove(&(port_name.to_string(), f.spec().name.clone(), w)) {
                Some(stats) => f.instantiate_with_stats(w, stats),
                None => f.instantiate(w),
            }
            .map_err(|e| anyhow::anyhow!("port `{port_name}`: {e}"))?;
            table.push((port_name.to_string(), st.name().to_string(), w, st.stats().clone()));
            stages.push(st);
        }
        Ok(Some(Box::new(ChainStage { stages, scratch: [Verdict::Pass; BATCH_SIZE] })))
    }

    pub fn is_empty(&self) -> bool {
        self.chains.iter().all(Vec::is_empty)
    }
}

/// The plugin counters of the running chains (replaced on reload).
#[derive(Debug, Default)]
pub struct PluginMetrics {
    pub table: std::sync::Mutex<StatsTable>,
}

impl PluginMetrics {
    /// Puts the counters of newly installed stages in place of the old ones.
    pub fn replace(&self, table: StatsTable) {
        *self.table.lock().unwrap_or_else(|e| e.into_inner()) = table;
    }
}

impl std::fmt::Debug for ChainStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainStage").field("plugins", &self.stages.len()).finish()
    }
}

impl MetricsSource for PluginMetrics {
    fn encode(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let table = self.table.lock().unwrap_or_else(|x| x.into_inner());
        let labels = |port: &str, plugin: &str, w: usize| {
            vec![("port", port.to_string()), ("plugin", plugin.to_string()), ("worker", w.to_string())]
        };
        type Pick = fn(&PluginStats) -> u64;
        let counters: [(&str, &str, Pick); 7] = [
            ("wasmswitch_plugin_batches", "Plugin batch calls.", |s| s.batches.get()),
            ("wasmswitch_plugin_packets", "Packets in plugin batch calls.", |s| s.packets.get()),
            (
                "wasmswitch_plugin_policy_packets",
                "Packets whose verdict came from the on_error policy (fault or quarantine).",
                |s| s.policy_packets.get(),
            ),
            ("wasmswitch_plugin_call_cycles", "TSC cycles spent in plugin calls (encode, call, decode).", |s| {
                s.call_cycles.get()
            }),
            (
                "wasmswitch_plugin_log_suppressed",
                "Plugin log lines and fault warnings dropped by the per-worker rate limit.",
                |s| s.log_suppressed.get(),
            ),
            ("wasmswitch_plugin_reinstantiations", "Fresh plugin instances made after faults.", |s| {
                s.reinstantiations.get()
            }),
            (
                "wasmswitch_plugin_quarantine_lifted",
                "Quarantines lifted by a reload (the plugin runs again; its counters carry on).",
                |s| s.quarantine_lifted.get(),
            ),
        ];
        for (name, help, pick) in counters {
            let samples: Vec<_> = table.iter().map(|(p, n, w, s)| (labels(p, n, *w), pick(s))).collect();
            counter_family(e, name, help, &samples)?;
        }
        let mut verdicts = Vec::new();
        for (p, n, w, s) in table.iter() {
            for (kind, c) in [
                ("pass", &s.verdict_pass),
                ("drop", &s.verdict_drop),
                ("redirect", &s.verdict_redirect),
                ("host", &s.verdict_host),
                ("host_copy", &s.verdict_host_copy),
            ] {
                let mut l = labels(p, n, *w);
                l.push(("verdict", kind.to_string()));
                verdicts.push((l, c.get()));
            }
        }
        counter_family(e, "wasmswitch_plugin_verdicts", "Verdicts returned by plugins, by kind.", &verdicts)?;
        let mut faults = Vec::new();
        for (p, n, w, s) in table.iter() {
            for r in FaultReason::ALL {
                let mut l = labels(p, n, *w);
                l.push(("reason", r.as_str().to_string()));
                faults.push((l, s.faults(r).get()));
            }
        }
        counter_family(
            e,
            "wasmswitch_plugin_faults",
            "Plugin faults (trap, deadline, memory, bad_output, instantiate).",
            &faults,
        )?;
        let q: Vec<_> = table.iter().map(|(p, n, w, s)| (labels(p, n, *w), s.quarantined.get() as i64)).collect();
        gauge_family(e, "wasmswitch_plugin_quarantined", "1 while the plugin is quarantined on that worker.", &q)?;
        let mut named = Vec::new();
        for (p, n, w, s) in table.iter() {
            for (cname, v) in s.named.snapshot() {
                let mut l = labels(p, n, *w);
                l.push(("counter", cname));
                named.push((l, v));
            }
        }
        counter_family(e, "wasmswitch_plugin_counter", "Counters registered by plugins themselves.", &named)
    }
}
