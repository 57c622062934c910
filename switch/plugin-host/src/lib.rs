//! Runs sandboxed WebAssembly policy plugins (components of `wit/plugin.wit`) as the switch's
//! ingress verdict stage.
//!
//! Life of a plugin:
//!
//! 1. [`PluginEngine::compile`] (control thread, off the data path): reads the file, refuses
//!    any import outside `wasmswitch:plugin/host` naming it, checks the exports, compiles (or
//!    loads the compiled code from the cache directory), links it against the host functions,
//!    and runs `init` once on a throw-away instance so a bad config fails here, with the
//!    plugin's name. The result is a [`PluginFactory`]: `Send + Sync`, share it in an `Arc`.
//! 2. [`PluginFactory::instantiate`] (once per worker): a [`WasmStage`] with its own `Store`,
//!    instance, limits and counters ([`PluginStats`]). It is a [`VerdictStage`]; the daemon
//!    hands it to the worker, which installs it with `Pipeline::set_ingress` between batches
//!    (that is also how a hot reload swaps plugins without losing a frame).
//! 3. [`WasmStage::run`]: one component call per batch. A trap, a deadline overrun, a memory
//!    limit hit or malformed verdicts make it apply the plugin's `on_error` policy to the
//!    batch, count and log the fault, and replace the instance before the next batch (a
//!    trapped component instance cannot be entered again). After `max_faults` faults the
//!    plugin is quarantined on that worker: skipped, policy applied, until reloaded.
//!
//! The call shape (why `list<u8>` in and out, hand-written guest glue, no post-return) is
//! explained in `plugins/sdk/src/rt.rs` and `plugins/README.md`, with measurements.

mod codec;
mod stats;

use std::fmt;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, ComponentType, Func, InstancePre, Lift, Linker, TypedFunc, WasmList, WasmStr};
use wasmtime::{Config, Engine, Store, StoreContextMut};

use wasmswitch_core::counter::cycles;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_plugin_sdk::abi;

pub use codec::{decode_verdicts, encode_batch, NativeStage};
pub use stats::{FaultReason, NamedCounters, PluginStats, MAX_NAMED};
pub use wasmswitch_plugin_sdk;

/// What a plugin's packets get when it faults or is quarantined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnError {
    /// Leave the verdicts as they were before the call (`Pass`): fail open.
    #[default]
    Pass,
    /// Drop the whole batch: fail closed.
    Drop,
}

/// One plugin entry of the switch's YAML (the daemon parses YAML into this; no serde here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginSpec {
    /// Name used in logs, errors and metrics.
    pub name: String,
    /// The component file (`.wasm`).
    pub path: PathBuf,
    /// Handed to the plugin's `init` as is (YAML or JSON text by convention; may be empty).
    pub config: String,
    /// N: how many leading bytes of each frame the plugin sees (0..=1024).
    pub header_bytes: u16,
    pub on_error: OnError,
    /// Longest a batch call may run before it is interrupted.
    pub deadline: Duration,
    /// Cap on the plugin's linear memory, per instance (per worker).
    pub memory_limit: usize,
    /// Faults on one worker before the plugin is quarantined there (at least 1).
    pub max_faults: u32,
}

impl PluginSpec {
    pub const DEFAULT_HEADER_BYTES: u16 = 128;
    pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);
    pub const DEFAULT_MEMORY_LIMIT: usize = 16 << 20;
    pub const DEFAULT_MAX_FAULTS: u32 = 3;

    /// A spec with the defaults: 128 header bytes, on_error pass, 5 ms deadline, 16 MiB, 3 faults.
    pub fn new(name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            path: path.into(),
            config: String::new(),
            header_bytes: Self::DEFAULT_HEADER_BYTES,
            on_error: OnError::Pass,
            deadline: Self::DEFAULT_DEADLINE,
            memory_limit: Self::DEFAULT_MEMORY_LIMIT,
            max_faults: Self::DEFAULT_MAX_FAULTS,
        }
    }
}

/// What went wrong loading a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// A field of the spec is out of range.
    Spec,
    /// Not a valid component (or not a component at all).
    Compile,
    /// It imports something outside the world (WASI, sockets, another version, ...).
    ForbiddenImport,
    /// Its exports are not the `wasmswitch:plugin/plugin` world's.
    WrongWorld,
    /// Instantiation failed (e.g. its initial memory is above the limit).
    Instantiate,
    /// `init` refused the config (or trapped).
    Init,
}

/// An error that names the plugin it is about.
#[derive(Clone, Debug)]
pub struct PluginError {
    pub plugin: String,
    pub kind: ErrorKind,
    pub message: String,
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin `{}`: {}", self.plugin, self.message)
    }
}

impl std::error::Error for PluginError {}

fn err(spec: &PluginSpec, kind: ErrorKind, message: impl Into<String>) -> PluginError {
    PluginError { plugin: spec.name.clone(), kind, message: message.into() }
}

/// `wasmtime::Error` is not `std::error::Error`; flatten it (with its causes) into text.
fn wt(e: &wasmtime::Error) -> String {
    format!("{e:#}")
}

/// Engine-wide settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Where compiled plugins are cached (`<sha256>.cwasm`); `None` disables the cache.
    /// Loading an entry runs the native code in it: the directory must be writable only by
    /// the daemon's user (entries are written atomically, tmp + rename).
    pub cache_dir: Option<PathBuf>,
    /// Epoch tick: deadline granularity. A deadline fires between `deadline` and
    /// `deadline + tick` after the call starts.
    pub epoch_tick: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self { cache_dir: None, epoch_tick: Duration::from_millis(1) }
    }
}

/// The wasmtime engine, host functions and compile cache; one per process.
pub struct PluginEngine {
    engine: Engine,
    linker: Linker<HostState>,
    opts: EngineOptions,
    stop: Arc<AtomicBool>,
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The WIT `level` enum (constructed by lifting from the guest, hence no Rust constructor).
#[allow(dead_code)]
#[derive(ComponentType, Lift, Clone, Copy, Debug)]
#[component(enum)]
#[repr(u8)]
enum Level {
    #[component(name = "error")]
    Error,
    #[component(name = "warn")]
    Warn,
    #[component(name = "info")]
    Info,
    #[component(name = "debug")]
    Debug,
}

/// Per-instance host state (the `Store`'s data).
pub struct HostState {
    name: Arc<str>,
    worker: usize,
    stats: Arc<PluginStats>,
    limiter: Limiter,
    /// Log token bucket: tokens, last refill.
    log_tokens: f64,
    log_last: Instant,
    clock_base: Instant,
    deadline: DeadlineWatch,
}

/// Turns the epoch deadline (wall time) into a CPU-time deadline. The epoch ticks on wall
/// time, so a worker descheduled in the middle of a call (a busy host, a VM whose vCPU was not
/// running: 4-7 ms gaps several times a minute on the machines this was built on) would
/// overrun a 5 ms deadline without the plugin doing anything wrong, and three such stalls
/// would quarantine it. So the first time the deadline passes in a call, the watch notes the
/// thread's CPU time and extends the deadline by one more period; at each later expiry the
/// call is interrupted if it used at least half a deadline of CPU since the note (it is
/// spinning), and extended again if not (it was stalled), up to `MAX_STALL_EXTENSIONS`. A
/// plugin that spins is stopped after one to two deadlines; the clock is read only on expiry.
struct DeadlineWatch {
    /// Deadline in epoch ticks (the period).
    ticks: u64,
    cpu_budget: Duration,
    /// Thread CPU time at the first expiry in the current call.
    cpu_mark: Option<Duration>,
    extensions: u32,
}

const MAX_STALL_EXTENSIONS: u32 = 16;

impl DeadlineWatch {
    /// Called before every call (two stores).
    #[inline]
    fn arm(&mut self) {
        self.cpu_mark = None;
        self.extensions = 0;
    }

    fn expired(&mut self) -> wasmtime::UpdateDeadline {
        let now = thread_cpu_time();
        let spinning = match self.cpu_mark {
            None => {
                self.cpu_mark = Some(now);
                false
            }
            Some(mark) => now.saturating_sub(mark) >= self.cpu_budget / 2,
        };
        if spinning || self.extensions >= MAX_STALL_EXTENSIONS {
            return wasmtime::UpdateDeadline::Interrupt;
        }
        self.extensions += 1;
        wasmtime::UpdateDeadline::Continue(self.ticks)
    }
}

/// CPU time of the calling thread (a syscall: `CLOCK_THREAD_CPUTIME_ID` has no vDSO path).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a live, writable timespec; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

const LOG_BURST: f64 = 20.0;
const LOG_PER_SEC: f64 = 10.0;
const LOG_MAX_LEN: usize = 512;

struct Limiter {
    max_memory: usize,
    /// Set when a memory.grow was refused during the current call.
    denied: bool,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.max_memory {
            self.denied = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 65_536)
    }

    fn instances(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        4
    }
}

fn host_log(mut cx: StoreContextMut<'_, HostState>, (level, msg): (Level, WasmStr)) -> wasmtime::Result<()> {
    let now = Instant::now();
    let s = cx.data_mut();
    s.log_tokens = (s.log_tokens + now.duration_since(s.log_last).as_secs_f64() * LOG_PER_SEC).min(LOG_BURST);
    s.log_last = now;
    if s.log_tokens < 1.0 {
        s.stats.log_suppressed.inc();
        return Ok(());
    }
    s.log_tokens -= 1.0;
    let (name, worker) = (s.name.clone(), s.worker);
    let text = msg.to_str(&cx)?;
    let mut end = text.len().min(LOG_MAX_LEN);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    let level = match level {
        Level::Error => log::Level::Error,
        Level::Warn => log::Level::Warn,
        Level::Info => log::Level::Info,
        Level::Debug => log::Level::Debug,
    };
    log::log!(target: "wasmswitch::plugin", level, "plugin `{name}` (worker {worker}): {text}");
    Ok(())
}

impl PluginEngine {
    /// Builds the engine: Cranelift, component model, no async/concurrency support, epoch
    /// interruption (a ticker thread advances the epoch every `epoch_tick`).
    pub fn new(opts: EngineOptions) -> Result<Arc<Self>, String> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.concurrency_support(false);
        config.epoch_interruption(true);
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        // `perf` names plugin functions when this is set (wasmtime writes /tmp/perf-PID.map).
        if std::env::var_os("WASMSWITCH_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(|e| format!("wasmtime engine: {}", wt(&e)))?;
        let mut linker = Linker::new(&engine);
        {
            let mut root = linker.root();
            let mut host = root.instance(abi::HOST_INTERFACE).map_err(|e| wt(&e))?;
            host.func_wrap("log", host_log).map_err(|e| wt(&e))?;
            host.func_wrap("register-counter", |cx: StoreContextMut<'_, HostState>, (name,): (String,)| {
                Ok((cx.data().stats.named.register(&name),))
            })
            .map_err(|e| wt(&e))?;
            host.func_wrap("counter-add", |cx: StoreContextMut<'_, HostState>, (id, delta): (u32, u64)| {
                cx.data().stats.named.add(id, delta);
                Ok(())
            })
            .map_err(|e| wt(&e))?;
            host.func_wrap("now-ns", |cx: StoreContextMut<'_, HostState>, (): ()| {
                Ok((cx.data().clock_base.elapsed().as_nanos() as u64,))
            })
            .map_err(|e| wt(&e))?;
        }
        if let Some(dir) = &opts.cache_dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("plugin cache {}: {e}", dir.display()))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, stop2, tick) = (engine.weak(), stop.clone(), opts.epoch_tick);
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| format!("epoch thread: {e}"))?;
        Ok(Arc::new(Self { engine, linker, opts, stop }))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Cache file for `bytes` under this engine's configuration: sha256 over the component
    /// and wasmtime's own compatibility hash (version, target, settings).
    fn cache_path(&self, bytes: &[u8]) -> Option<PathBuf> {
        struct ShaHasher(Sha256);
        impl Hasher for ShaHasher {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, b: &[u8]) {
                self.0.update(b);
            }
        }
        let dir = self.opts.cache_dir.as_ref()?;
        let mut h = ShaHasher(Sha256::new());
        std::hash::Hash::hash(&self.engine.precompile_compatibility_hash(), &mut h);
        h.0.update(b"wasmswitch-plugin-cache-v1");
        h.0.update(bytes);
        let hex: String = h.0.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Some(dir.join(format!("{hex}.cwasm")))
    }

    fn load_component(&self, spec: &PluginSpec, bytes: &[u8]) -> Result<(Component, bool), PluginError> {
        let cached = self.cache_path(bytes);
        if let Some(p) = cached.as_ref().filter(|p| p.exists()) {
            // Read into memory rather than `deserialize_file`: that one mmaps the file, and a
            // cache entry truncated under a live plugin would then SIGBUS the switch.
            let loaded = std::fs::read(p).map_err(|e| e.to_string()).and_then(|data| {
                // SAFETY: the bytes are a file this process (or an earlier run) wrote with
                // `Component::serialize` into the daemon's own cache directory, under a name
                // that includes wasmtime's compatibility hash; wasmtime also checks the
                // header and version. The cache directory must be writable only by the
                // daemon's user (see `EngineOptions::cache_dir`).
                unsafe { Component::deserialize(&self.engine, &data) }.map_err(|e| wt(&e))
            });
            match loaded {
                Ok(c) => return Ok((c, true)),
                Err(e) => log::warn!("plugin `{}`: ignoring cache entry {}: {e}", spec.name, p.display()),
            }
        }
        let c = Component::new(&self.engine, bytes).map_err(|e| {
            err(spec, ErrorKind::Compile, format!("{}: not a valid component: {}", spec.path.display(), wt(&e)))
        })?;
        if let Some(p) = cached {
            match c.serialize() {
                Ok(data) => {
                    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                    if std::fs::write(&tmp, data).and_then(|_| std::fs::rename(&tmp, &p)).is_err() {
                        let _ = std::fs::remove_file(&tmp);
                        log::warn!("plugin `{}`: could not write cache entry {}", spec.name, p.display());
                    }
                }
                Err(e) => log::warn!("plugin `{}`: serialize: {}", spec.name, wt(&e)),
            }
        }
        Ok((c, false))
    }

    /// Loads, checks and compiles `spec`, and runs its `init` once (on a throw-away instance)
    /// so that a bad config is reported now. Call it off the data path.
    pub fn compile(self: &Arc<Self>, spec: &PluginSpec) -> Result<Arc<PluginFactory>, PluginError> {
        if spec.header_bytes as usize > abi::MAX_HEADER_BYTES {
            return Err(err(
                spec,
                ErrorKind::Spec,
                format!("header_bytes {} is above {}", spec.header_bytes, abi::MAX_HEADER_BYTES),
            ));
        }
        if spec.max_faults == 0 || spec.deadline.is_zero() || spec.memory_limit < 64 << 10 {
            return Err(err(
                spec,
                ErrorKind::Spec,
                "max_faults and deadline must be positive and memory_limit at least 64 KiB",
            ));
        }
        let bytes = read_regular_file(&spec.path, MAX_PLUGIN_BYTES)
            .map_err(|e| err(spec, ErrorKind::Io, format!("{}: {e}", spec.path.display())))?;
        let (component, from_cache) = self.load_component(spec, &bytes)?;
        let ty = component.component_type();

        // No capabilities: the host interface is the only import allowed.
        let forbidden: Vec<&str> =
            ty.imports(&self.engine).map(|(n, _)| n).filter(|n| *n != abi::HOST_INTERFACE).collect();
        if !forbidden.is_empty() {
            let hint = if forbidden.iter().any(|n| n.starts_with("wasmswitch:plugin/")) {
                format!(" (this host implements {})", abi::WIT_PACKAGE)
            } else {
                String::new()
            };
            return Err(err(
                spec,
                ErrorKind::ForbiddenImport,
                format!(
                    "refused: imports `{}`, outside the wasmswitch:plugin world{hint}; plugins get no capabilities (no filesystem, sockets, environment or WASI at all), only `{}`",
                    forbidden.join("`, `"),
                    abi::HOST_INTERFACE
                ),
            ));
        }
        let exports: Vec<&str> = ty.exports(&self.engine).map(|(n, _)| n).collect();
        for want in ["init", "process"] {
            if !exports.contains(&want) {
                return Err(err(
                    spec,
                    ErrorKind::WrongWorld,
                    format!(
                        "does not export `{want}`: not a component of the {} `plugin` world (it exports: {})",
                        abi::WIT_PACKAGE,
                        if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
                    ),
                ));
            }
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            err(spec, ErrorKind::WrongWorld, format!("does not link against {}: {}", abi::HOST_INTERFACE, wt(&e)))
        })?;
        let factory = Arc::new(PluginFactory { engine: self.clone(), spec: spec.clone(), pre, from_cache });
        // The check run: types of the exports, instantiation under the limits, init.
        factory.new_instance(usize::MAX, Arc::default())?;
        Ok(factory)
    }

    /// `wasmswitch check`: everything [`PluginEngine::compile`] does, reporting with the name.
    pub fn check(self: &Arc<Self>, spec: &PluginSpec) -> Result<(), PluginError> {
        self.compile(spec).map(|_| ())
    }
}

/// A compiled, linked, checked plugin: makes one [`WasmStage`] per worker. `Send + Sync`.
/// Largest plugin file accepted (a component is typically tens to hundreds of KiB).
pub const MAX_PLUGIN_BYTES: u64 = 64 << 20;

/// Reads `path` if it is a regular file of at most `max` bytes. The file is opened with
/// O_NONBLOCK and checked with fstat before any read, so a FIFO, socket or device put where a
/// file was expected is refused at once instead of blocking the reader (a FIFO with no writer
/// would block a plain open forever).
pub fn read_regular_file(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("file is {} bytes, more than the limit of {max}", meta.len()),
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    // take(max + 1): a file that grows while it is read is still caught by the limit.
    file.take(max + 1).read_to_end(&mut data)?;
    if data.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("file grew past the limit of {max} bytes"),
        ));
    }
    Ok(data)
}

pub struct PluginFactory {
    engine: Arc<PluginEngine>,
    spec: PluginSpec,
    pre: InstancePre<HostState>,
    from_cache: bool,
}

/// The exports of one live instance.
struct Live {
    store: Store<HostState>,
    process: Func,
}

type InitFn = TypedFunc<(&'static str,), (Result<(), String>,)>;
type ProcessFn<'a> = TypedFunc<(&'a [u8],), (WasmList<u8>,)>;

impl PluginFactory {
    pub fn spec(&self) -> &PluginSpec {
        &self.spec
    }

    /// Whether the compiled code came from the cache directory (no compilation).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    fn new_instance(&self, worker: usize, stats: Arc<PluginStats>) -> Result<Live, PluginError> {
        let spec = &self.spec;
        let now = Instant::now();
        let state = HostState {
            name: spec.name.as_str().into(),
            worker,
            stats,
            limiter: Limiter { max_memory: spec.memory_limit, denied: false },
            log_tokens: LOG_BURST,
            log_last: now,
            clock_base: now,
            deadline: DeadlineWatch {
                ticks: deadline_ticks(spec.deadline, self.engine.opts.epoch_tick),
                cpu_budget: spec.deadline,
                cpu_mark: None,
                extensions: 0,
            },
        };
        let mut store = Store::new(self.engine.engine(), state);
        store.limiter(|s| &mut s.limiter);
        let ticks = store.data().deadline.ticks;
        store.set_epoch_deadline(ticks);
        store.epoch_deadline_callback(|mut cx| Ok(cx.data_mut().deadline.expired()));
        let instance = self.pre.instantiate(&mut store).map_err(|e| {
            let m = if store.data().limiter.denied {
                format!("instantiation needs more than the {} byte memory limit", spec.memory_limit)
            } else {
                wt(&e)
            };
            err(spec, ErrorKind::Instantiate, m)
        })?;
        let init: InitFn = instance
            .get_typed_func(&mut store, "init")
            .map_err(|e| err(spec, ErrorKind::WrongWorld, format!("export `init` has the wrong type: {}", wt(&e))))?;
        let process = instance
            .get_func(&mut store, "process")
            .ok_or_else(|| err(spec, ErrorKind::WrongWorld, "no `process` export"))?;
        process.typed::<(&[u8],), (WasmList<u8>,)>(&store).map_err(|e| {
            err(spec, ErrorKind::WrongWorld, format!("export `process` has the wrong type: {}", wt(&e)))
        })?;
        store.set_epoch_deadline(ticks);
        store.data_mut().deadline.arm();
        match init.call(&mut store, (spec.config.as_str(),)) {
            Ok((Ok(()),)) => {}
            Ok((Err(msg),)) => return Err(err(spec, ErrorKind::Init, format!("init refused the config: {msg}"))),
            Err(e) => return Err(err(spec, ErrorKind::Init, format!("init failed: {}", describe_fault(&e, &store).1))),
        }
        store.data_mut().limiter.denied = false;
        Ok(Live { store, process })
    }

    /// A stage for worker `worker` with fresh counters.
    pub fn instantiate(self: &Arc<Self>, worker: usize) -> Result<WasmStage, PluginError> {
        self.instantiate_with_stats(worker, Arc::default())
    }

    /// A stage that keeps counting into `stats` (e.g. the previous version's, across a
    /// reload). Clears the quarantine flag.
    pub fn instantiate_with_stats(
        self: &Arc<Self>,
        worker: usize,
        stats: Arc<PluginStats>,
    ) -> Result<WasmStage, PluginError> {
        let live = self.new_instance(worker, stats.clone())?;
        stats.quarantined.set(0);
        Ok(WasmStage {
            factory: self.clone(),
            worker,
            live: Some(live),
            stats,
            faults: 0,
            quarantined: false,
            buf: Vec::new(),
            ticks: deadline_ticks(self.spec.deadline, self.engine.opts.epoch_tick),
        })
    }
}

fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    (deadline.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64).max(1) + 1
}

/// Classifies a failed call.
fn describe_fault(e: &wasmtime::Error, store: &Store<HostState>) -> (FaultReason, String) {
    let trap = e.downcast_ref::<wasmtime::Trap>().copied();
    if trap == Some(wasmtime::Trap::Interrupt) {
        (FaultReason::Deadline, "deadline exceeded (the call used its deadline of CPU time)".into())
    } else if store.data().limiter.denied {
        (FaultReason::Memory, format!("memory limit of {} bytes reached: {}", store.data().limiter.max_memory, wt(e)))
    } else {
        (FaultReason::Trap, wt(e))
    }
}

/// A plugin instance owned by one worker: a [`VerdictStage`] making one call per batch.
pub struct WasmStage {
    /// Makes a fresh instance after a fault.
    factory: Arc<PluginFactory>,
    worker: usize,
    /// `None` after a fault until a fresh instance is made (at the next batch).
    live: Option<Live>,
    stats: Arc<PluginStats>,
    faults: u32,
    quarantined: bool,
    /// The encoded batch, reused.
    buf: Vec<u8>,
    ticks: u64,
}

impl WasmStage {
    pub fn stats(&self) -> &Arc<PluginStats> {
        &self.stats
    }

    pub fn name(&self) -> &str {
        &self.factory.spec.name
    }

    pub fn is_quarantined(&self) -> bool {
        self.quarantined
    }

    fn apply_policy(&self, verdicts: &mut [Verdict]) {
        self.stats.policy_packets.add(verdicts.len() as u64);
        if self.factory.spec.on_error == OnError::Drop {
            verdicts.fill(Verdict::Drop);
            self.stats.verdict_drop.add(verdicts.len() as u64);
        } else {
            self.stats.verdict_pass.add(verdicts.len() as u64);
        }
    }

    fn fault(&mut self, reason: FaultReason, why: &str, verdicts: &mut [Verdict]) {
        self.live = None;
        self.faults += 1;
        self.stats.faults(reason).inc();
        verdicts.fill(Verdict::Pass);
        self.apply_policy(verdicts);
        let spec = &self.factory.spec;
        log::warn!(
            target: "wasmswitch::plugin",
            "plugin `{}` (worker {}): fault {}/{} ({}): {}; on_error {:?} applied to {} packets",
            spec.name,
            self.worker,
            self.faults,
            spec.max_faults,
            reason.as_str(),
            why,
            spec.on_error,
            verdicts.len()
        );
        if self.faults >= spec.max_faults {
            self.quarantined = true;
            self.stats.quarantined.set(1);
            log::error!(target: "wasmswitch::plugin", "plugin `{}` (worker {}): quarantined after {} faults; on_error {:?} applies until it is reloaded", spec.name, self.worker, self.faults, spec.on_error);
        }
    }

    fn call(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        if self.live.is_none() {
            match self.factory.new_instance(self.worker, self.stats.clone()) {
                Ok(l) => {
                    self.stats.reinstantiations.inc();
                    self.live = Some(l);
                }
                Err(e) => return self.fault(FaultReason::Instantiate, &e.message, verdicts),
            }
        }
        let header_bytes = self.factory.spec.header_bytes as usize;
        encode_batch(batch, header_bytes, &mut self.buf);
        let Some(live) = self.live.as_mut() else { return };
        live.store.set_epoch_deadline(self.ticks);
        let state = live.store.data_mut();
        state.limiter.denied = false;
        state.deadline.arm();
        // SAFETY: `live.process` was checked with `Func::typed::<(&[u8],), (WasmList<u8>,)>`
        // when this instance was created (`new_instance`); the parameter lifetime is the only
        // difference, and it is not part of the component type. Re-checking per batch would
        // cost a type comparison on every call.
        let f: ProcessFn<'_> = unsafe { TypedFunc::new_unchecked(live.process) };
        let result = f.call(&mut live.store, (&self.buf[..],));
        let outcome = match result {
            Ok((list,)) => decode_verdicts(list.as_le_slice(&live.store), verdicts, &self.stats)
                .map_err(|m| (FaultReason::BadOutput, m)),
            Err(e) => Err(describe_fault(&e, &live.store)),
        };
        if let Err((reason, why)) = outcome {
            self.fault(reason, &why, verdicts);
        }
    }
}

impl VerdictStage for WasmStage {
    fn run(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        let n = batch.descs.len().min(verdicts.len());
        if n == 0 {
            return;
        }
        let verdicts = &mut verdicts[..n];
        let start = cycles();
        self.stats.batches.inc();
        self.stats.packets.add(n as u64);
        if self.quarantined {
            self.apply_policy(verdicts);
        } else {
            self.call(batch, verdicts);
        }
        self.stats.call_cycles.add(cycles().wrapping_sub(start));
    }
}

/// For `wasmswitch bench --plugin FILE`: a stage for worker 0 from a file and a config, with
/// default limits, on a fresh engine.
pub fn stage_from_file(path: &Path, config: &str, header_bytes: u16) -> Result<WasmStage, PluginError> {
    let mut spec = PluginSpec::new(path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin"), path);
    spec.config = config.to_owned();
    spec.header_bytes = header_bytes;
    let engine = PluginEngine::new(EngineOptions::default()).map_err(|m| err(&spec, ErrorKind::Compile, m))?;
    engine.compile(&spec)?.instantiate(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::UpdateDeadline;

    fn spin_cpu(d: Duration) {
        let t = thread_cpu_time();
        while thread_cpu_time().saturating_sub(t) < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn deadline_watch_tells_a_stall_from_a_spin() {
        let mut w = DeadlineWatch { ticks: 3, cpu_budget: Duration::from_millis(10), cpu_mark: None, extensions: 0 };
        w.arm();
        assert!(matches!(w.expired(), UpdateDeadline::Continue(3)), "the first expiry only notes the CPU clock");
        std::thread::sleep(Duration::from_millis(30)); // descheduled: wall time passes, no CPU
        assert!(matches!(w.expired(), UpdateDeadline::Continue(3)), "a stalled call is extended");
        spin_cpu(Duration::from_millis(6));
        assert!(
            matches!(w.expired(), UpdateDeadline::Interrupt),
            "a call that used half a deadline of CPU since the note is stopped"
        );
        // A new call starts clean, and a call that keeps expiring without using CPU is still
        // stopped after MAX_STALL_EXTENSIONS periods.
        w.arm();
        for _ in 0..MAX_STALL_EXTENSIONS {
            assert!(matches!(w.expired(), UpdateDeadline::Continue(3)));
        }
        assert!(matches!(w.expired(), UpdateDeadline::Interrupt));
    }

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let p = std::env::temp_dir().join(format!("wasmswitch-read-{}", std::process::id()));
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read_regular_file(&p, 10).unwrap(), b"0123456789");
        let e = read_regular_file(&p, 9).unwrap_err();
        assert!(e.to_string().contains("10 bytes, more than the limit of 9"), "{e}");
        std::fs::remove_file(&p).unwrap();
        // A device (and a FIFO likewise) is refused after open(O_NONBLOCK) + fstat, unread.
        let e = read_regular_file(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
