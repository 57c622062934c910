//! Plugin chains: YAML → compiled plugins (off the data path) → one chain stage per port per
//! worker (its live chain and maybe a shadow chain), swapped in at a batch boundary on reload.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prometheus_client::encoding::DescriptorEncoder;
use wasmswitch_core::counter::Counter;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_core::{PortId, BATCH_SIZE};
use wasmswitch_plugin_host::{
    check_dir, CacheKey, CacheStats, CompileCache, Discard, EngineOptions, FaultReason, PluginEngine, PluginFactory,
    PluginSpec, PluginStats, WasmStage,
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
        on_error: s.on_error,
        deadline: Duration::from_micros(s.deadline_us.value),
        memory_limit: s.memory_limit_kib.value * 1024,
        max_faults: s.max_faults.value.max(1),
        context: String::new(),
        bytes: s.bytes.clone(),
    }
}

/// Which chain of a port a plugin runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `ports[].plugins`: its verdicts decide.
    Live,
    /// `ports[].shadow`: its verdicts are compared with the live chain's, never applied.
    Shadow,
}

impl Role {
    /// `live` or `shadow`: the `chain` of `GET /api/v1/plugins`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Live => "live",
            Role::Shadow => "shadow",
        }
    }

    /// Where a plugin of this chain of `port` runs, as its log lines say.
    pub fn context(self, port: &str) -> String {
        match self {
            Role::Live => format!("port `{port}`"),
            Role::Shadow => format!("port `{port}`'s shadow chain"),
        }
    }
}

/// One port's compiled chains.
#[derive(Default)]
pub struct PortChains {
    /// `ports[].plugins`, in order.
    pub live: Vec<Arc<PluginFactory>>,
    /// `ports[].shadow`, in order.
    pub shadow: Vec<Arc<PluginFactory>>,
}

impl PortChains {
    /// The chain of `role`.
    pub fn get(&self, role: Role) -> &[Arc<PluginFactory>] {
        match role {
            Role::Live => &self.live,
            Role::Shadow => &self.shadow,
        }
    }

    /// Whether the port has no plugin, live or shadow.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty() && self.shadow.is_empty()
    }
}

/// Every configured port's compiled chains (index = the port's place in the config).
pub struct CompiledChains {
    /// By the port's place in the config.
    pub chains: Vec<PortChains>,
}

/// The compile cache's directory: `WASMSWITCH_CACHE_DIR`, else `$XDG_CACHE_HOME/wasmswitch`,
/// else `$HOME/.cache/wasmswitch`.
fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("WASMSWITCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| Path::new(&d).join("wasmswitch")))
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/wasmswitch")))
}

/// Why plugins are compiled without the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheRefused {
    /// The directory: absent and not creatable, not this user's, writable by others, or not
    /// writable by the daemon.
    Directory = 0,
    /// The key file (see [`CacheKey::load_or_create`]).
    Key = 1,
}

impl CacheRefused {
    const ALL: [CacheRefused; 2] = [CacheRefused::Directory, CacheRefused::Key];

    fn as_str(self) -> &'static str {
        match self {
            CacheRefused::Directory => "directory",
            CacheRefused::Key => "key",
        }
    }
}

/// The process's compile cache: the key (read or made once, by [`load_cache_key`]), and what
/// its engines counted (one engine per start and per reload).
#[derive(Default)]
struct CacheState {
    key: OnceLock<Result<CacheKey, (CacheRefused, String)>>,
    stats: Arc<CacheStats>,
    refused: [AtomicU64; CacheRefused::ALL.len()],
}

static CACHE: LazyLock<CacheState> = LazyLock::new(CacheState::default);

fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Reads (or makes) the compile cache's key, as the process's user now; once per process,
/// later calls do nothing. The daemon calls it before it drops privileges, with `run_as` the
/// uid it then runs as: the key file is root's, mode 0600, so a process of that uid, which
/// may write the directory, cannot read the key and so cannot forge an entry. The directory
/// must already exist then, owned by that uid (root making it would own it); without a
/// privilege drop (`run_as` the current uid, or `None`) it is made here, mode 0700. Anything
/// refused is kept as the reason every engine gives for running without the cache.
pub fn load_cache_key(run_as: Option<u32>) {
    let Some(dir) = cache_dir() else { return };
    CACHE.key.get_or_init(|| {
        let euid = geteuid();
        let uid = run_as.unwrap_or(euid);
        if uid == euid {
            // Made here as it would be by the engine: by the user it runs as.
            let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir);
        }
        check_dir(&dir, uid).map_err(|e| {
            let e = if uid != euid && !dir.exists() {
                format!(
                    "plugin cache {}: does not exist; make it, owned by uid {uid} and mode 0700 (the key its entries are authenticated with is made in it at start, before the daemon drops privileges)",
                    dir.display()
                )
            } else {
                e
            };
            (CacheRefused::Directory, e)
        })?;
        CacheKey::load_or_create(&dir).map_err(|e| (CacheRefused::Key, e))
    });
}

/// One engine per start and reload, with the compile cache (see [`cache_dir`]) so a restart
/// does not recompile. A cache whose directory or key is refused is not used: plugins are
/// compiled, said in a warning and counted (`wasmswitch_plugin_cache_refused_total`).
pub fn engine() -> Result<Arc<PluginEngine>> {
    let cache = cache_dir().and_then(|dir| {
        load_cache_key(None);
        let key = match CACHE.key.get() {
            Some(Ok(key)) => Ok(key.clone()),
            Some(Err(e)) => Err(e.clone()),
            None => return None,
        };
        // The directory again, as the user the process is now: it may have changed since the
        // key was read, and one this process cannot write (a `user:` the daemon dropped to,
        // whose HOME is still root's) costs a compile per start, not the start.
        let usable = key.and_then(|key| {
            let writable = {
                let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
                // SAFETY: `c` is a NUL-terminated path that lives across the call.
                unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
            };
            check_dir(&dir, geteuid()).map_err(|e| (CacheRefused::Directory, e))?;
            if !writable {
                return Err((
                    CacheRefused::Directory,
                    format!("plugin cache {}: this process cannot write it (set WASMSWITCH_CACHE_DIR to a directory the daemon's user owns)", dir.display()),
                ));
            }
            Ok(CompileCache { dir, key })
        });
        match usable {
            Ok(c) => Some(c),
            Err((why, e)) => {
                CACHE.refused[why as usize].fetch_add(1, Ordering::Relaxed);
                log::warn!("{e}, so plugins are compiled at every start");
                None
            }
        }
    });
    PluginEngine::new(EngineOptions { cache, cache_stats: CACHE.stats.clone(), ..EngineOptions::default() })
        .map_err(|e| anyhow::anyhow!("cannot start the plugin engine: {e}"))
}

/// `wasmswitch_plugin_cache_*` and `wasmswitch_plugin_compiles_total`: the whole process's.
fn encode_cache_metrics(e: &mut DescriptorEncoder) -> std::fmt::Result {
    let c = &*CACHE;
    let one = |v: &AtomicU64| -> [(Vec<(&'static str, String)>, u64); 1] { [(Vec::new(), v.load(Ordering::Relaxed))] };
    counter_family(
        e,
        "wasmswitch_plugin_cache_hits",
        "Plugins loaded from the compile cache (not compiled).",
        &one(&c.stats.hits),
    )?;
    counter_family(
        e,
        "wasmswitch_plugin_compiles",
        "Plugins compiled: no cache, no entry for them yet, or their entry discarded.",
        &one(&c.stats.compiled),
    )?;
    let discarded: Vec<_> =
        Discard::ALL.iter().map(|d| (vec![("reason", d.as_str().to_string())], c.stats.discarded(*d))).collect();
    counter_family(
        e,
        "wasmswitch_plugin_cache_discarded",
        "Compile cache entries deleted, never loaded, and their plugin compiled: bad_mac (forged, damaged or of another key), other_component (copied over another's name), format, unreadable, wasmtime (refused by its own checks).",
        &discarded,
    )?;
    let refused: Vec<_> = CacheRefused::ALL
        .iter()
        .map(|r| (vec![("reason", r.as_str().to_string())], c.refused[*r as usize].load(Ordering::Relaxed)))
        .collect();
    counter_family(
        e,
        "wasmswitch_plugin_cache_refused",
        "Starts and reloads that compiled their plugins without the compile cache because its directory or key file was refused (the log says why).",
        &refused,
    )
}

/// Compiles (or loads from cache) and initialises every plugin of `cfg`, shadow chains
/// included; the first error is located at the plugin's `path` in the config file, as a
/// config error is, and names the port and plugin.
pub fn compile(engine: &Arc<PluginEngine>, cfg: &Config) -> Result<CompiledChains> {
    let mut chains = Vec::new();
    for port in &cfg.ports {
        let mut c = PortChains::default();
        for (role, list, out) in [(Role::Live, &port.plugins, &mut c.live), (Role::Shadow, &port.shadow, &mut c.shadow)]
        {
            for s in list {
                let mut sp = spec(s);
                sp.context = role.context(&port.name.value);
                let f = engine.compile(&sp).map_err(|e| {
                    let chain = match role {
                        Role::Live => "",
                        Role::Shadow => " (shadow chain)",
                    };
                    let message = format!("port `{}`{chain}: {e}", port.name.value);
                    // A config made in code has no file to point into.
                    if cfg.file.as_os_str().is_empty() {
                        return anyhow::anyhow!(message);
                    }
                    let at = s.path.referenced;
                    anyhow::Error::new(config::ConfigError {
                        file: cfg.file.clone(),
                        line: at.line(),
                        column: at.column(),
                        message,
                    })
                })?;
                out.push(f);
            }
        }
        chains.push(c);
    }
    Ok(CompiledChains { chains })
}

/// Ready stages for every port, by worker: `stages[w]` = (port id, stage) pairs.
pub type Stages = Vec<Vec<(PortId, Option<Box<dyn VerdictStage>>)>>;

/// One plugin on one worker, as the metrics, the API and the next reload see it.
#[derive(Clone)]
pub struct Running {
    /// The port's name.
    pub port: String,
    /// Which of the port's chains it runs in.
    pub role: Role,
    /// The worker's index.
    pub worker: usize,
    /// The compiled plugin the instance came from, which a reload compares with the file's to
    /// keep an unchanged plugin's instance.
    pub factory: Arc<PluginFactory>,
    /// The instance's counters and state (faults, quarantine).
    pub stats: Arc<PluginStats>,
}

impl Running {
    /// The plugin's name (`plugins[].name`).
    pub fn name(&self) -> &str {
        &self.factory.spec().name
    }
}

/// A port's live × shadow comparison on one worker.
#[derive(Clone)]
pub struct ShadowRunning {
    /// The port's name.
    pub port: String,
    /// The worker's index.
    pub worker: usize,
    /// The verdict counts, kept across reloads while the port has a shadow chain.
    pub stats: Arc<ShadowStats>,
}

/// What the workers run: every plugin instance and every shadow comparison.
#[derive(Clone, Default)]
pub struct RunningSet {
    /// Every plugin instance: one per plugin of a chain, per worker.
    pub plugins: Vec<Running>,
    /// Every shadow comparison: one per port with a shadow chain and worker.
    pub shadows: Vec<ShadowRunning>,
}

/// Which live plugins [`stages`] puts through the smoke run before installing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Smoke {
    /// None (at start: `check` ran it, or was told not to).
    Skip,
    /// The new and changed ones (a reload).
    Changed,
    /// Every one (a reload that changes `switch.batch`: a plugin running as it is has only
    /// been called with batches of the old size).
    All,
}

/// The one plugin-install path, for start and reload: compiles `cfg`'s plugins (off the data
/// path; no engine at all when there are none) and instantiates every worker's stage for every
/// configured port, addressed by id through `id_of`. Ports without plugins get `None`, which
/// clears a chain a reload took away.
///
/// `running` is what runs now (empty at start). A plugin running on the same port, in the
/// same chain, under the same name, keeps counting into its counters, so they never go
/// backwards; if its component, config and limits are also unchanged, its instance is kept
/// with its state (the worker takes it over, see [`ChainStage`]'s `take_over`). The second
/// value is what runs once the stages are installed.
///
/// With `smoke` ([`Smoke::Changed`], a reload's): every live plugin that is not running as it
/// is (new, or with another component, config or limits; with [`Smoke::All`], every live
/// plugin) first goes through `check`'s smoke run at `switch.batch`; one that
/// faults on the built-in frames refuses the whole change, so the running one stays.
pub fn stages(
    cfg: &Config,
    id_of: &dyn Fn(&str) -> Option<PortId>,
    running: &RunningSet,
    smoke: Smoke,
) -> Result<(Stages, RunningSet)> {
    let workers = cfg.workers.len();
    let mut next = RunningSet::default();
    let any = cfg.ports.iter().any(|p| !p.plugins.is_empty() || !p.shadow.is_empty());
    let chains = if any { Some(compile(&engine()?, cfg)?) } else { None };
    let ported = cfg.ports.iter().zip(chains.iter().flat_map(|c| &c.chains));
    for (index, (port, c)) in ported.enumerate().filter(|_| smoke != Smoke::Skip) {
        let name = &port.name.value;
        let running_as_is = |f: &PluginFactory| {
            running.plugins.iter().any(|r| {
                r.port == *name && r.role == Role::Live && r.name() == f.spec().name && r.factory.same_plugin(f)
            })
        };
        // The id the port's frames will carry (`in-port`), which a reload can set apart from
        // its position in the file.
        let in_port = id_of(name).unwrap_or(PortId::from_index(index));
        for f in c.live.iter().filter(|f| smoke == Smoke::All || !running_as_is(f)) {
            let report = f
                .smoke_batch(in_port, cfg.switch.batch.value)
                .map_err(|e| anyhow::anyhow!("port `{name}`: {e} (the smoke run of `wasmswitch check`)"))?;
            if let Some(w) = report.near_deadline() {
                log::warn!("port `{name}`, plugin `{}`: {w}", f.spec().name);
            }
        }
    }
    let mut stages: Stages = (0..workers).map(|_| Vec::new()).collect();
    for (w, out) in stages.iter_mut().enumerate() {
        for (index, port) in cfg.ports.iter().enumerate() {
            let name = &port.name.value;
            let id = id_of(name).with_context(|| format!("port `{name}` has no id"))?;
            let stage = match &chains {
                Some(c) => c.instantiate(w, index, name, running, &mut next)?,
                None => None,
            };
            out.push((id, stage));
        }
    }
    if chains.is_some() {
        let kept = next.plugins.iter().filter(|r| running.keeps(r)).count();
        // At start there is nothing to keep: the count of instances says all.
        let kept = if running.plugins.is_empty() { String::new() } else { format!("{kept} of ") };
        log::info!(
            "plugins loaded: {} ({kept}{} instances{})",
            cfg.ports
                .iter()
                .flat_map(|p| {
                    p.plugins
                        .iter()
                        .map(|x| x.name.value.clone())
                        .chain(p.shadow.iter().map(|x| format!("{} (shadow)", x.name.value)))
                })
                .collect::<Vec<_>>()
                .join(", "),
            next.plugins.len(),
            if running.plugins.is_empty() { "" } else { " kept with their state" }
        );
    }
    Ok((stages, next))
}

impl CompiledChains {
    /// Worker `w`'s stage for configured port `index` (None when it has no plugins); what it
    /// runs is added to `next`. See [`stages`] for what is taken from `running`.
    pub fn instantiate(
        &self,
        w: usize,
        index: usize,
        port_name: &str,
        running: &RunningSet,
        next: &mut RunningSet,
    ) -> Result<Option<Box<dyn VerdictStage>>> {
        let Some(chains) = self.chains.get(index).filter(|c| !c.is_empty()) else { return Ok(None) };
        let mut chain = |role: Role| -> Result<Chain> {
            let mut stages = Vec::new();
            let mut adopt = Vec::new();
            for f in chains.get(role) {
                let was = running
                    .plugins
                    .iter()
                    .find(|r| r.port == port_name && r.role == role && r.worker == w && r.name() == f.spec().name);
                let (stage, keep) = match was {
                    // Quarantined: its instance is gone, and a remake on the worker (under the
                    // batch deadline) may be what failed; make one here, under the init bound,
                    // for `Chain::take_over` to install instead.
                    Some(r) if r.factory.same_plugin(f) && r.stats.quarantined.get() != 0 => (
                        f.instantiate_with_stats(w, r.stats.clone())
                            .map_err(|e| anyhow::anyhow!("port `{port_name}`: {e}"))?,
                        true,
                    ),
                    // The reload's factory, not the running one's: the same plugin, but a
                    // promoted one's running factory was compiled for the shadow chain, and
                    // its label would say so.
                    Some(r) if r.factory.same_plugin(f) => (f.deferred(w, r.stats.clone()), true),
                    Some(r) => (
                        f.instantiate_with_stats(w, r.stats.clone())
                            .map_err(|e| anyhow::anyhow!("port `{port_name}`: {e}"))?,
                        false,
                    ),
                    None => (f.instantiate(w).map_err(|e| anyhow::anyhow!("port `{port_name}`: {e}"))?, false),
                };
                next.plugins.push(Running {
                    port: port_name.to_string(),
                    role,
                    worker: w,
                    factory: stage.factory().clone(),
                    stats: stage.stats().clone(),
                });
                stages.push(stage);
                adopt.push(keep);
            }
            Ok(Chain::new(stages, adopt))
        };
        let live = chain(Role::Live)?;
        let shadow = if chains.shadow.is_empty() {
            None
        } else {
            // The comparison counts on as long as the port has a shadow chain.
            let stats = running
                .shadows
                .iter()
                .find(|s| s.port == port_name && s.worker == w)
                .map(|s| s.stats.clone())
                .unwrap_or_default();
            next.shadows.push(ShadowRunning { port: port_name.to_string(), worker: w, stats: stats.clone() });
            Some(Box::new(Shadow { chain: chain(Role::Shadow)?, verdicts: [Verdict::Pass; BATCH_SIZE], stats }))
        };
        Ok(Some(Box::new(ChainStage { port: port_name.into(), live, shadow })))
    }

    /// Whether no port has a plugin, live or shadow.
    pub fn is_empty(&self) -> bool {
        self.chains.iter().all(PortChains::is_empty)
    }
}

/// A port's ingress stage on one worker: the live chain, whose verdicts decide, and maybe a
/// shadow chain run on the same batches, whose verdicts are only compared.
pub struct ChainStage {
    port: Arc<str>,
    live: Chain,
    shadow: Option<Box<Shadow>>,
}

impl ChainStage {
    /// A port's stage from ready plugin stages, the shadow chain only if `shadow` has any
    /// (the bench and tests; the daemon's come from [`stages`]).
    pub fn new(port: &str, live: Vec<WasmStage>, shadow: Vec<WasmStage>) -> Self {
        let chain = |v: Vec<WasmStage>| {
            let n = v.len();
            Chain::new(v, vec![false; n])
        };
        let shadow = (!shadow.is_empty()).then(|| {
            Box::new(Shadow { chain: chain(shadow), verdicts: [Verdict::Pass; BATCH_SIZE], stats: Arc::default() })
        });
        ChainStage { port: port.into(), live: chain(live), shadow }
    }

    /// The live × shadow counts, when there is a shadow chain.
    pub fn shadow_stats(&self) -> Option<&Arc<ShadowStats>> {
        self.shadow.as_ref().map(|s| &s.stats)
    }

    /// Makes the shadow chain the live one (the worker calls it between two rounds, so no
    /// batch sees half of each). A promoted plugin named like one of the live chain counts
    /// into that one's counters from now on ([`WasmStage::count_into`]), so its live series
    /// neither goes backwards nor counts the shadow's batches twice. The old live chain comes
    /// back, to be dropped off the worker; `None` when there is no shadow chain.
    pub fn promote(&mut self) -> Option<Chain> {
        let mut shadow = self.shadow.take()?;
        for st in &mut shadow.chain.stages {
            st.relabel(&Role::Live.context(&self.port));
            if let Some(old) = self.live.stages.iter().find(|o| o.name() == st.name()) {
                st.count_into(old.stats().clone());
            }
        }
        Some(std::mem::replace(&mut self.live, shadow.chain))
    }

    /// Takes the shadow chain away (returned, to be dropped off the worker).
    pub fn discard(&mut self) -> Option<Box<Shadow>> {
        self.shadow.take()
    }
}

impl VerdictStage for ChainStage {
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        self.live.run(batch, verdicts);
        if let Some(shadow) = self.shadow.as_mut() {
            shadow.run(batch, verdicts);
        }
    }

    fn take_over(&mut self, old: &mut dyn VerdictStage) {
        let Some(old) = old.as_any_mut().and_then(|a| a.downcast_mut::<ChainStage>()) else { return };
        self.live.take_over(&mut old.live);
        if let (Some(new), Some(was)) = (self.shadow.as_mut(), old.shadow.as_mut()) {
            new.chain.take_over(&mut was.chain);
        }
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn bad_redirect(&mut self, packet: usize, to: PortId) {
        self.live.bad_redirect(&self.port, packet, to);
    }
}

impl std::fmt::Debug for ChainStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainStage")
            .field("port", &self.port)
            .field("plugins", &self.live.stages.len())
            .field("shadow", &self.shadow.as_ref().map(|s| s.chain.stages.len()))
            .finish()
    }
}

/// Plugins run in order on the whole batch; the first non-`pass` verdict a packet gets
/// decides it. One call per plugin per batch.
pub struct Chain {
    stages: Vec<WasmStage>,
    /// Per stage: take the running instance of the same plugin over at `take_over`.
    adopt: Vec<bool>,
    /// Which stage decided each packet of the last batch (kept for chains of two or more,
    /// to name the plugin behind a bad redirect).
    decider: [u8; BATCH_SIZE],
    scratch: [Verdict; BATCH_SIZE],
    redirects: Vec<RedirectLog>,
}

impl Chain {
    fn new(stages: Vec<WasmStage>, adopt: Vec<bool>) -> Self {
        let redirects = stages.iter().map(|_| RedirectLog::default()).collect();
        Chain { stages, adopt, decider: [0; BATCH_SIZE], scratch: [Verdict::Pass; BATCH_SIZE], redirects }
    }

    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        let n = verdicts.len();
        let Some((first, rest)) = self.stages.split_first_mut() else { return };
        first.run(batch, verdicts);
        if rest.is_empty() {
            return;
        }
        self.decider[..n].fill(0);
        for (k, stage) in rest.iter_mut().enumerate() {
            self.scratch[..n].fill(Verdict::Pass);
            stage.run(batch, &mut self.scratch[..n]);
            for ((v, s), d) in verdicts.iter_mut().zip(&self.scratch[..n]).zip(&mut self.decider[..n]) {
                if *v == Verdict::Pass && *s != Verdict::Pass {
                    *v = *s;
                    *d = k as u8 + 1;
                }
            }
        }
    }

    /// Swaps in `old`'s instances of the plugins marked to adopt (see [`stages`]); the
    /// placeholders go back into `old`, which is dropped off the worker.
    fn take_over(&mut self, old: &mut Chain) {
        for (stage, adopt) in self.stages.iter_mut().zip(&self.adopt) {
            if !adopt {
                continue;
            }
            if let Some(was) = old.stages.iter_mut().find(|o| o.name() == stage.name()) {
                if was.has_instance() || !stage.has_instance() {
                    std::mem::swap(stage, was);
                } else {
                    // Its instance faulted and is gone (quarantined: a remake on the worker,
                    // under the batch deadline, failed); the one `stages` made off the worker,
                    // under the init bound, takes over instead.
                    log::info!(
                        target: "wasmswitch::plugin",
                        "plugin `{}` (worker {}): its instance had faulted; the reload's fresh one takes over",
                        stage.name(),
                        stage.worker()
                    );
                }
                stage.lift_quarantine();
            }
        }
        // The replaced stages stop counting here: each new one takes their counters over now
        // (with what its `init` counted in staging), not at its first batch, which an idle
        // port may never see.
        for stage in &mut self.stages {
            stage.install();
        }
    }

    fn bad_redirect(&mut self, port: &str, packet: usize, to: PortId) {
        let k = if self.stages.len() > 1 { self.decider.get(packet).copied().unwrap_or(0) as usize } else { 0 };
        if let (Some(stage), Some(log)) = (self.stages.get(k), self.redirects.get_mut(k)) {
            log.note(stage.name(), port, stage.worker(), to);
        }
    }
}

/// How often a plugin's bad redirects are logged on one port and worker, at most.
const REDIRECT_LOG_EVERY: Duration = Duration::from_secs(60);

/// Rate limit of one plugin's bad-redirect warnings: the first at once, then one a minute
/// at most with the count since.
#[derive(Default)]
struct RedirectLog {
    last: Option<Instant>,
    since: u64,
}

impl RedirectLog {
    /// Counts one bad redirect; true when it was logged.
    fn note(&mut self, plugin: &str, port: &str, worker: usize, to: PortId) -> bool {
        self.since += 1;
        let now = Instant::now();
        match self.last {
            None => log::warn!(
                target: "wasmswitch::plugin",
                "plugin `{plugin}` on port `{port}` (worker {worker}): redirected a frame to port id {to}, which is not a port that is up; the frame is dropped and counted in wasmswitch_port_drops_total{{reason=\"bad_redirect\"}} (this is logged at most once a minute)"
            ),
            Some(t) if now.duration_since(t) >= REDIRECT_LOG_EVERY => log::warn!(
                target: "wasmswitch::plugin",
                "plugin `{plugin}` on port `{port}` (worker {worker}): {} more frames redirected to ports that are not up in the last {} s (the last to port id {to}); dropped",
                self.since,
                now.duration_since(t).as_secs()
            ),
            Some(_) => return false,
        }
        self.last = Some(now);
        self.since = 0;
        true
    }
}

/// A shadow chain and its comparison with the live verdicts.
pub struct Shadow {
    chain: Chain,
    verdicts: [Verdict; BATCH_SIZE],
    stats: Arc<ShadowStats>,
}

impl Shadow {
    /// Runs the shadow chain on `batch` and counts its verdicts against `live` (the live
    /// chain's, already final). Its faults and verdicts stay here.
    fn run(&mut self, batch: &BatchView<'_>, live: &[Verdict]) {
        let n = live.len();
        let shadow = &mut self.verdicts[..n];
        shadow.fill(Verdict::Pass);
        self.chain.run(batch, shadow);
        // Counted in registers, added to the shared counters once per batch.
        let mut matrix = [0u64; KINDS * KINDS];
        let mut differ = 0u64;
        for (l, s) in live.iter().zip(shadow.iter()) {
            matrix[l.kind() * KINDS + s.kind()] += 1;
            differ += u64::from(l != s);
        }
        for (c, m) in self.stats.matrix.iter().zip(matrix) {
            if m != 0 {
                c.add(m);
            }
        }
        self.stats.differ.add(differ);
    }
}

const KINDS: usize = Verdict::KINDS.len();

/// A port's live × shadow verdict counts on one worker (single writer: the worker).
#[derive(Debug, Default)]
pub struct ShadowStats {
    /// `matrix[live.kind() * 5 + shadow.kind()]`: packets by (live verdict, shadow verdict).
    pub matrix: [Counter; KINDS * KINDS],
    /// Packets whose verdicts differ, redirect targets included.
    pub differ: Counter,
}

impl ShadowStats {
    /// Packets compared: the matrix's sum.
    pub fn packets(&self) -> u64 {
        self.matrix.iter().map(Counter::get).sum()
    }
}

/// What runs (replaced on reload, promote and discard), for the metrics and the API.
#[derive(Default)]
pub struct PluginMetrics {
    /// What runs now, swapped whole by [`PluginMetrics::replace`], copied by [`PluginMetrics::get`].
    pub running: std::sync::Mutex<RunningSet>,
}

impl std::fmt::Debug for PluginMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.get();
        f.debug_struct("PluginMetrics").field("plugins", &r.plugins.len()).field("shadows", &r.shadows.len()).finish()
    }
}

impl PluginMetrics {
    /// Puts what newly installed stages run in place of the old.
    pub fn replace(&self, running: RunningSet) {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = running;
    }

    /// A copy of what runs.
    pub fn get(&self) -> RunningSet {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl RunningSet {
    /// True when `r` (of the set a reload installs) is one of these instances, kept with its
    /// state: same counters, same component, config and limits.
    pub fn keeps(&self, r: &Running) -> bool {
        self.plugins.iter().any(|o| Arc::ptr_eq(&o.stats, &r.stats) && o.factory.same_plugin(&r.factory))
    }

    /// `/api/v1/plugins`: one entry per plugin per worker, with what is loaded (the
    /// component's and the config's SHA-256) and its counters.
    pub fn plugins_json(&self) -> serde_json::Value {
        let plugins: Vec<_> = self
            .plugins
            .iter()
            .map(|r| {
                let s = &r.stats;
                let verdicts: serde_json::Map<String, serde_json::Value> = Verdict::KINDS
                    .iter()
                    .zip([&s.verdict_pass, &s.verdict_drop, &s.verdict_redirect, &s.verdict_host, &s.verdict_host_copy])
                    .map(|(k, c)| (k.to_string(), c.get().into()))
                    .collect();
                let faults: serde_json::Map<String, serde_json::Value> =
                    FaultReason::ALL.iter().map(|f| (f.as_str().to_string(), s.faults(*f).get().into())).collect();
                let counters: serde_json::Map<String, serde_json::Value> =
                    s.named.snapshot().into_iter().map(|(k, v)| (k, v.into())).collect();
                serde_json::json!({
                    "port": r.port, "plugin": r.name(), "chain": r.role.as_str(), "worker": r.worker,
                    "component_sha256": hex(&r.factory.component_digest()),
                    "config_sha256": hex(&r.factory.config_digest()),
                    "path": r.factory.spec().path,
                    "batches": s.batches.get(), "packets": s.packets.get(),
                    "verdicts": verdicts, "faults": s.faults_total(), "faults_by_reason": faults,
                    "quarantined": s.quarantined.get() == 1, "quarantine_lifted": s.quarantine_lifted.get(),
                    "reinstantiations": s.reinstantiations.get(), "counters": counters,
                })
            })
            .collect();
        serde_json::json!({ "plugins": plugins })
    }

    /// `/api/v1/shadow`: per port with a shadow chain, both chains and the live × shadow
    /// verdict matrix summed over workers.
    pub fn shadow_json(&self) -> serde_json::Value {
        let mut ports: Vec<&str> = Vec::new();
        for s in &self.shadows {
            if !ports.contains(&s.port.as_str()) {
                ports.push(&s.port);
            }
        }
        let out: Vec<_> = ports
            .into_iter()
            .map(|port| {
                let chain = |role: Role| {
                    let names: Vec<&str> = self
                        .plugins
                        .iter()
                        .filter(|r| r.port == port && r.role == role && r.worker == 0)
                        .map(Running::name)
                        .collect();
                    names
                };
                let mut matrix = [0u64; KINDS * KINDS];
                let mut differ = 0;
                for s in self.shadows.iter().filter(|s| s.port == port) {
                    for (m, c) in matrix.iter_mut().zip(&s.stats.matrix) {
                        *m += c.get();
                    }
                    differ += s.stats.differ.get();
                }
                let rows: serde_json::Map<String, serde_json::Value> = Verdict::KINDS
                    .iter()
                    .enumerate()
                    .map(|(l, lk)| {
                        let row: serde_json::Map<String, serde_json::Value> = Verdict::KINDS
                            .iter()
                            .enumerate()
                            .map(|(s, sk)| (sk.to_string(), matrix[l * KINDS + s].into()))
                            .collect();
                        (lk.to_string(), row.into())
                    })
                    .collect();
                // A quarantined plugin's verdicts are its on_error policy's: said beside the
                // comparison, which would otherwise read as agreement.
                let mut quarantined: Vec<&str> = self
                    .plugins
                    .iter()
                    .filter(|r| r.port == port && r.stats.quarantined.get() != 0)
                    .map(Running::name)
                    .collect();
                quarantined.dedup();
                serde_json::json!({
                    "port": port, "live": chain(Role::Live), "shadow": chain(Role::Shadow),
                    "packets": matrix.iter().sum::<u64>(), "differ": differ, "matrix": rows,
                    "quarantined": quarantined,
                })
            })
            .collect();
        serde_json::json!({ "ports": out })
    }
}

/// Reads one counter of a plugin's stats.
type Pick = fn(&PluginStats) -> u64;

/// The plugin counters that are one sample per running plugin: name, help, and the counter.
const COUNTERS: [(&str, &str, Pick); 9] = [
    (
        "wasmswitch_plugin_batches",
        "Batches the plugin answered for, itself or (faulted, quarantined) by its on_error policy.",
        |s| s.batches.get(),
    ),
    (
        "wasmswitch_plugin_packets",
        "Packets the plugin answered for; those its on_error policy answered are in policy_packets.",
        |s| s.packets.get(),
    ),
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
        "wasmswitch_plugin_wall_overruns",
        "Plugin calls whose wall time passed twice their deadline (the worker descheduled, or code no epoch check stops); the next calls are measured in CPU time.",
        |s| s.wall_overruns.get(),
    ),
    (
        "wasmswitch_plugin_ports_unseen",
        "TCP/UDP frames dropped because their ports lay past the plugin's header_bytes while their IP header did not (IPv6 extension headers, IPv4 options): raise header_bytes.",
        |s| s.ports_unseen.get(),
    ),
    (
        "wasmswitch_plugin_quarantine_lifted",
        "Quarantines lifted by a reload (the plugin runs again; its counters carry on).",
        |s| s.quarantine_lifted.get(),
    ),
];

impl MetricsSource for PluginMetrics {
    fn encode(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
        let running = self.get();
        let table = &running.plugins;
        // Shadow plugins carry `chain="shadow"`; live ones keep the labels they always had.
        let labels = |r: &Running| {
            let mut l =
                vec![("port", r.port.clone()), ("plugin", r.name().to_string()), ("worker", r.worker.to_string())];
            if r.role == Role::Shadow {
                l.push(("chain", "shadow".to_string()));
            }
            l
        };
        // What a call produced (verdicts, faults, the plugin's own counters) read before the
        // packets and batches: a worker counts a batch before it calls the plugin, so one
        // scrape never shows a plugin counting more than the packets it was given.
        let mut verdicts = Vec::new();
        for r in table {
            let s = &r.stats;
            for (kind, c) in Verdict::KINDS.iter().zip([
                &s.verdict_pass,
                &s.verdict_drop,
                &s.verdict_redirect,
                &s.verdict_host,
                &s.verdict_host_copy,
            ]) {
                let mut l = labels(r);
                l.push(("verdict", kind.to_string()));
                verdicts.push((l, c.get()));
            }
        }
        let mut faults = Vec::new();
        for r in table {
            for f in FaultReason::ALL {
                let mut l = labels(r);
                l.push(("reason", f.as_str().to_string()));
                faults.push((l, r.stats.faults(f).get()));
            }
        }
        let mut named = Vec::new();
        for r in table {
            for (cname, v) in r.stats.named.snapshot() {
                let mut l = labels(r);
                l.push(("counter", cname));
                named.push((l, v));
            }
        }
        for (name, help, pick) in COUNTERS {
            let samples: Vec<_> = table.iter().map(|r| (labels(r), pick(&r.stats))).collect();
            counter_family(e, name, help, &samples)?;
        }
        counter_family(
            e,
            "wasmswitch_plugin_verdicts",
            "Verdicts by kind, the plugin's own and its on_error policy's (policy_packets counts those).",
            &verdicts,
        )?;
        counter_family(
            e,
            "wasmswitch_plugin_faults",
            "Plugin faults (trap, deadline, memory, bad_output, instantiate).",
            &faults,
        )?;
        let q: Vec<_> = table.iter().map(|r| (labels(r), r.stats.quarantined.get() as i64)).collect();
        gauge_family(e, "wasmswitch_plugin_quarantined", "1 while the plugin is quarantined on that worker.", &q)?;
        // Not `..._counter`: promtool's lint refuses a metric name that names its type.
        counter_family(e, "wasmswitch_plugin_events", "Counters registered by plugins themselves.", &named)?;
        encode_shadows(e, &running.shadows)?;
        encode_cache_metrics(e)
    }
}

/// The shadow chains' verdicts against the live ones', per port and worker.
fn encode_shadows(e: &mut DescriptorEncoder, shadows: &[ShadowRunning]) -> std::fmt::Result {
    let mut matrix = Vec::new();
    let mut differ = Vec::new();
    for s in shadows {
        let base = vec![("port", s.port.clone()), ("worker", s.worker.to_string())];
        for (i, c) in s.stats.matrix.iter().enumerate() {
            let mut l = base.clone();
            l.push(("live", Verdict::KINDS[i / KINDS].to_string()));
            l.push(("shadow", Verdict::KINDS[i % KINDS].to_string()));
            matrix.push((l, c.get()));
        }
        differ.push((base, s.stats.differ.get()));
    }
    counter_family(
        e,
        "wasmswitch_shadow_verdicts",
        "Packets seen by a port's live and shadow chains, by (live verdict, shadow verdict); shadow verdicts are never applied.",
        &matrix,
    )?;
    counter_family(
        e,
        "wasmswitch_shadow_differ",
        "Packets whose shadow verdict differs from the live one (redirect targets included).",
        &differ,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_redirects_are_logged_at_once_then_once_a_minute_with_the_count() {
        let mut log = RedirectLog::default();
        assert!(log.note("acl", "p0", 0, PortId(9)), "the first is logged");
        assert!(!log.note("acl", "p0", 0, PortId(9)) && !log.note("acl", "p0", 0, PortId(7)));
        assert_eq!(log.since, 2);
        log.last = log.last.and_then(|t| t.checked_sub(REDIRECT_LOG_EVERY));
        assert!(log.note("acl", "p0", 0, PortId(9)), "a minute later, with the count");
        assert_eq!(log.since, 0);
    }

    #[test]
    fn a_promoted_plugin_counts_on_in_its_live_namesakes_counters_under_its_live_name() {
        let core = r#"(module (memory (export "memory") 1)
            (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
            (func (export "init") (param i32 i32) (result i32) (i32.store8 (i32.const 16) (i32.const 0)) (i32.const 16))
            (func (export "process") (param i32 i32) (result i32) unreachable))"#;
        let module = wat::parse_str(core).unwrap();
        let component = wasmswitch_componentize::World::embedded().unwrap().componentize(&module, "test").unwrap();
        let path = std::env::temp_dir().join(format!("wasmswitch-promote-{}.wasm", std::process::id()));
        std::fs::write(&path, component).unwrap();
        let engine = PluginEngine::new(wasmswitch_plugin_host::EngineOptions::default()).unwrap();
        let stage = |role: Role| {
            let mut spec = wasmswitch_plugin_host::PluginSpec::new("x", &path);
            spec.context = role.context("p0");
            engine.compile(&spec).unwrap().instantiate(0).unwrap()
        };
        let mut chains = ChainStage::new("p0", vec![stage(Role::Live)], vec![stage(Role::Shadow)]);
        let live = chains.live.stages[0].stats().clone();
        assert_eq!(chains.shadow.as_ref().unwrap().chain.stages[0].label(), "plugin `x` on port `p0`'s shadow chain");
        drop(chains.promote());
        std::fs::remove_file(&path).unwrap();
        let promoted = &chains.live.stages[0];
        assert_eq!(promoted.label(), "plugin `x` on port `p0`");
        assert!(Arc::ptr_eq(promoted.stats(), &live), "counts on in the live one's counters");
    }
}
