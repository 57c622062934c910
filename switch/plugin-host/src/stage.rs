//! A compiled plugin ([`PluginFactory`]) and its per-worker instances ([`WasmStage`]): one
//! component call per batch, faults, quarantine.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmswitch_core::counter::cycles;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_plugin_sdk::abi;
use wasmtime::component::{Func, InstancePre, TypedFunc, WasmList, WasmStr};
use wasmtime::Store;

use crate::codec::{decode_verdicts, drop_ports_unseen, encode_batch};
use crate::deadline::{deadline_ticks, thread_cpu_time, CpuWatch, CPU_WATCH_CALLS, INIT_DEADLINE};
use crate::engine::{read_regular_file, refuse_utf16_strings, EngineOptions, PluginEngine, MAX_PLUGIN_BYTES};
use crate::sandbox::{DeadlineWatch, HostState, Limiter, LogGate, On, Refusal};
use crate::spec::{err, wt, ErrorKind, OnError, PluginError, PluginSpec};
use crate::stats::{FaultReason, PluginStats, MAX_NAMED};
use crate::text::one_line;

impl PluginEngine {
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
        let read;
        let bytes = match &spec.bytes {
            Some(b) => &b.0[..],
            None => {
                read = read_regular_file(&spec.path, MAX_PLUGIN_BYTES)
                    .map_err(|e| err(spec, ErrorKind::Io, format!("{}: {e}", spec.path.display())))?;
                &read[..]
            }
        };
        refuse_utf16_strings(bytes).map_err(|m| err(spec, ErrorKind::WrongWorld, m))?;
        let (component, from_cache) = self.load_component(spec, bytes)?;
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
                        "does not export `{want}`: not a component of the {} `plugin` world (it exports: {}; a Rust plugin needs `export_plugin!(YourPlugin);` from the SDK)",
                        abi::WIT_PACKAGE,
                        if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
                    ),
                ));
            }
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            err(spec, ErrorKind::WrongWorld, format!("does not link against {}: {}", abi::HOST_INTERFACE, wt(&e)))
        })?;
        let factory = Arc::new(PluginFactory {
            engine: self.clone(),
            // The compiled component is what is kept, not the file's bytes.
            spec: PluginSpec { bytes: None, ..spec.clone() },
            pre,
            from_cache,
            component_digest: Sha256::digest(bytes).into(),
        });
        // The check run: types of the exports, instantiation under the limits, init.
        factory.new_instance(
            usize::MAX,
            factory.spec.label().into(),
            Arc::default(),
            &mut LogGate::new(),
            INIT_DEADLINE,
        )?;
        Ok(factory)
    }

    /// `wasmswitch check`: everything [`PluginEngine::compile`] does, reporting with the name.
    pub fn check(self: &Arc<Self>, spec: &PluginSpec) -> Result<(), PluginError> {
        self.compile(spec).map(|_| ())
    }
}

/// A compiled, linked, checked plugin: makes one [`WasmStage`] per worker. `Send + Sync`.
pub struct PluginFactory {
    pub(crate) engine: Arc<PluginEngine>,
    pub(crate) spec: PluginSpec,
    pub(crate) pre: InstancePre<HostState>,
    pub(crate) from_cache: bool,
    /// SHA-256 of the component file as loaded.
    pub(crate) component_digest: [u8; 32],
}

/// The exports of one live instance.
pub(crate) struct Live {
    pub(crate) store: Store<HostState>,
    pub(crate) process: Func,
}

/// `init`'s error comes as a `WasmStr`, read in place and cut to one line, where a `String`
/// would copy all of it (up to the guest's whole memory) first.
pub(crate) type InitFn = TypedFunc<(&'static str,), (Result<(), WasmStr>,)>;
pub(crate) type ProcessFn<'a> = TypedFunc<(&'a [u8],), (WasmList<u8>,)>;

impl PluginFactory {
    /// The spec it was compiled from (without the component's bytes).
    pub fn spec(&self) -> &PluginSpec {
        &self.spec
    }

    /// Whether the compiled code came from the cache directory (no compilation).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// SHA-256 of the component file this factory was compiled from.
    pub fn component_digest(&self) -> [u8; 32] {
        self.component_digest
    }

    /// SHA-256 of the config string handed to `init`.
    pub fn config_digest(&self) -> [u8; 32] {
        Sha256::digest(self.spec.config.as_bytes()).into()
    }

    /// True when an instance of `other` behaves as one of `self` would: the same component
    /// bytes, config and limits (the file's path may differ). A reload keeps the running
    /// instances of such a plugin, with their state.
    pub fn same_plugin(&self, other: &PluginFactory) -> bool {
        let (a, b) = (&self.spec, &other.spec);
        self.component_digest == other.component_digest
            && (&a.name, &a.config, a.header_bytes, a.on_error, a.deadline, a.memory_limit, a.max_faults)
                == (&b.name, &b.config, b.header_bytes, b.on_error, b.deadline, b.memory_limit, b.max_faults)
    }

    /// A fresh instance, initialised. Instantiation (start functions) and `init` run under
    /// `init_bound` of CPU time: [`INIT_DEADLINE`] off the data path (load, reload), where
    /// `init` may parse a large config or build tables once; the batch deadline for the fresh
    /// instance after a fault, made on the worker, so that a worker never waits longer for
    /// a plugin than for one batch call. `log` goes into
    /// the instance, and comes back on failure: an init that logs and fails on every retry
    /// stays under the same gate. `label` names the plugin in its log lines.
    pub(crate) fn new_instance(
        &self,
        worker: usize,
        label: Arc<str>,
        stats: Arc<PluginStats>,
        log: &mut LogGate,
        init_bound: Duration,
    ) -> Result<Live, PluginError> {
        let spec = &self.spec;
        let now = Instant::now();
        let tick = self.engine.opts.epoch_tick;
        // Off the data path, the init bound is a promise the error message states; the fresh
        // instance made on the worker after a fault is under the batch deadline, as a call.
        let watch = if init_bound >= INIT_DEADLINE {
            DeadlineWatch::for_init(init_bound, tick)
        } else {
            DeadlineWatch::for_calls(deadline_ticks(init_bound, tick), init_bound)
        };
        let init_ticks = watch.ticks;
        let state = HostState {
            name: label,
            worker,
            stats,
            counter_ids: None,
            limiter: Limiter::new(spec.memory_limit),
            log: *log,
            clock_base: now,
            deadline: watch,
        };
        let mut store = Store::new(self.engine.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(init_ticks);
        store.epoch_deadline_callback(|mut cx| Ok(cx.data_mut().deadline.expired()));
        let process = match self.start(&mut store) {
            Ok(p) => p,
            Err(e) => {
                *log = store.data().log;
                return Err(e);
            }
        };
        // From here on, batch calls: the plugin's own deadline.
        let st = store.data_mut();
        st.limiter.denied = None;
        st.deadline = DeadlineWatch::for_calls(deadline_ticks(spec.deadline, tick), spec.deadline);
        Ok(Live { store, process })
    }

    /// Instantiates in `store` and runs `init`; the `process` export.
    fn start(&self, store: &mut Store<HostState>) -> Result<Func, PluginError> {
        let spec = &self.spec;
        let (init_ticks, bound) = (store.data().deadline.ticks, store.data().deadline.bound());
        // What a remake on the worker may really use: a batch call's allowance, twice the
        // deadline as enforced in whole epoch ticks (a 10 µs deadline allows some ms).
        let allowed = if bound < INIT_DEADLINE { self.engine.opts.epoch_tick * init_ticks as u32 * 2 } else { bound };
        let (cpu0, wall0) = (thread_cpu_time(), Instant::now());
        // Microseconds under a millisecond: a 10 µs deadline must not read "0 ms".
        let time = |d: Duration| {
            if d < Duration::from_millis(1) {
                format!("{} µs", d.as_micros())
            } else {
                format!("{} ms", d.as_millis())
            }
        };
        let ran = || {
            format!(
                "it ran {} of CPU time ({} wall); instantiation and init may use {} of CPU{}",
                time(thread_cpu_time().saturating_sub(cpu0)),
                time(wall0.elapsed()),
                time(allowed),
                if bound < INIT_DEADLINE {
                    " when remade on the worker after a fault (as a batch call: twice the batch deadline as enforced, in whole epoch ticks; raise `deadline_us` above the init time, or reload to get an instance made off the worker)"
                } else {
                    ""
                }
            )
        };
        // One bound for instantiation (a core module's start function) and init together, as
        // the message above says: the watch notes the CPU clock here, once.
        store.data_mut().deadline.arm();
        let instance = self.pre.instantiate(&mut *store).map_err(|e| {
            let m = if let Some(r) = store.data().limiter.denied {
                match r {
                    Refusal::Limit => {
                        format!("instantiation needs more than the {} byte memory limit", spec.memory_limit)
                    }
                    Refusal::OwnMaximum(m) => {
                        format!("instantiation needs more than its memory's maximum of {m} bytes")
                    }
                }
            } else if e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
                format!("instantiation stopped: {}", ran())
            } else {
                wt(&e)
            };
            err(spec, ErrorKind::Instantiate, m)
        })?;
        let init: InitFn = instance
            .get_typed_func(&mut *store, "init")
            .map_err(|e| err(spec, ErrorKind::WrongWorld, format!("export `init` has the wrong type: {}", wt(&e))))?;
        let process = instance
            .get_func(&mut *store, "process")
            .ok_or_else(|| err(spec, ErrorKind::WrongWorld, "no `process` export"))?;
        process.typed::<(&[u8],), (WasmList<u8>,)>(&*store).map_err(|e| {
            err(spec, ErrorKind::WrongWorld, format!("export `process` has the wrong type: {}", wt(&e)))
        })?;
        store.set_epoch_deadline(init_ticks);
        match init.call(&mut *store, (spec.config.as_str(),)) {
            Ok((Ok(()),)) => {}
            Ok((Err(msg),)) => {
                let msg = match msg.to_str(&*store) {
                    Ok(m) => one_line(&m, INIT_ERROR_MAX_LEN),
                    Err(e) => format!("(an error that is not a string: {})", wt(&e)),
                };
                return Err(err(spec, ErrorKind::Init, format!("init refused the config: {msg}")));
            }
            Err(e) => {
                let (reason, why) = describe_fault(&e, store);
                let why = if reason == FaultReason::Deadline { format!("stopped: {}", ran()) } else { why };
                return Err(err(spec, ErrorKind::Init, format!("init failed: {why}")));
            }
        }
        // Remade on the worker: the bound is the batch deadline, and an epoch check may come
        // late (a starved ticker thread on a busy machine) or never (a bulk memory
        // instruction). An init over twice the bound as enforced, the most a batch call may
        // use, fails after the fact as a call does (`CpuWatch`): what the worker gets does not
        // depend on the load.
        if bound < INIT_DEADLINE && CpuWatch::since(cpu0, self.engine.opts.epoch_tick * init_ticks as u32).over() {
            return Err(err(spec, ErrorKind::Init, format!("init failed: over its bound when it returned: {}", ran())));
        }
        Ok(process)
    }

    /// A stage for worker `worker` with fresh counters.
    pub fn instantiate(self: &Arc<Self>, worker: usize) -> Result<WasmStage, PluginError> {
        let stats = Arc::<PluginStats>::default();
        let live =
            self.new_instance(worker, self.spec.label().into(), stats.clone(), &mut LogGate::new(), INIT_DEADLINE)?;
        let mut stage = self.deferred(worker, stats);
        stage.live = Some(live);
        Ok(stage)
    }

    /// A stage that keeps counting into `stats` (e.g. the previous version's, across a
    /// reload, so the counters never go backwards), from its install on the worker
    /// ([`WasmStage::install`]). Until then the stage, and the old one it replaces, may both
    /// be counting: the old one runs on until the install, or forever if the reload is
    /// refused after this. So this instance's `init` counts into
    /// [`PluginStats::staging`], never into `stats`, which only the worker writes; the install
    /// adds what it counted. At the install it also sets the `quarantined` gauge to 0 and, if
    /// the gauge was 1, counts a lifted quarantine.
    pub fn instantiate_with_stats(
        self: &Arc<Self>,
        worker: usize,
        stats: Arc<PluginStats>,
    ) -> Result<WasmStage, PluginError> {
        let staged = Arc::new(stats.staging());
        let live =
            self.new_instance(worker, self.spec.label().into(), staged.clone(), &mut LogGate::new(), INIT_DEADLINE)?;
        let mut stage = self.deferred(worker, stats);
        (stage.live, stage.staged) = (Some(live), Some(staged));
        Ok(stage)
    }
}

impl PluginFactory {
    /// A stage for worker `worker` counting into `stats`, with no instance yet: one is made at
    /// its first batch, on the worker, under the batch deadline (as after a fault). For a
    /// plugin a reload keeps: the worker normally swaps the running stage in for it
    /// ([`WasmStage::lift_quarantine`]), so this instance is made only if that one is missing.
    pub fn deferred(self: &Arc<Self>, worker: usize, stats: Arc<PluginStats>) -> WasmStage {
        WasmStage {
            factory: self.clone(),
            worker,
            live: None,
            label: self.spec.label().into(),
            stats,
            staged: None,
            faults: 0,
            quarantined: false,
            fresh: true,
            log: LogGate::new(),
            buf: Vec::new(),
            ticks: deadline_ticks(self.spec.deadline, self.engine.opts.epoch_tick),
            cpu_watch: 0,
            cpu_watch_len: 0,
        }
    }
}

/// Longest part of an `init` error string that the host shows (in `check`, a reload's answer
/// and the log); the rest is counted, not shown.
const INIT_ERROR_MAX_LEN: usize = 1024;

/// Classifies a failed call. The reason is one line (see [`fault_text`]); the whole error,
/// with wasmtime's full backtrace, goes to the debug log for whoever needs every frame.
pub(crate) fn describe_fault(e: &wasmtime::Error, store: &Store<HostState>) -> (FaultReason, String) {
    if log::log_enabled!(target: "wasmswitch::plugin", log::Level::Debug) {
        let s = store.data();
        log::debug!(target: "wasmswitch::plugin", "{} ({}): call failed: {e:?}", s.name, On(s.worker));
    }
    let trap = e.downcast_ref::<wasmtime::Trap>().copied();
    if trap == Some(wasmtime::Trap::Interrupt) {
        (FaultReason::Deadline, "deadline exceeded (the call used its deadline of CPU time)".into())
    } else if let Some(why) = store.data().limiter.refusal_text() {
        (FaultReason::Memory, format!("{why}: {}", fault_text(e)))
    } else {
        (FaultReason::Trap, fault_text(e))
    }
}

/// Frames of a guest backtrace kept in a fault's message.
pub(crate) const FAULT_FRAMES: usize = 3;

/// A failed call in one line: the root cause and the innermost [`FAULT_FRAMES`] frames.
/// wasmtime's full text is the whole backtrace over many lines, plus a note, for every fault.
/// After a Rust panic the innermost frames are the panic runtime's (`rust_panic`,
/// `__rust_abort`, ...), the same for every panic: they are skipped, so the frames shown are
/// the plugin's (the panic's message and place are in the SDK's log line before).
pub(crate) fn fault_text(e: &wasmtime::Error) -> String {
    let cause = e.root_cause().to_string();
    let mut s = cause.lines().next().unwrap_or("").to_string();
    if let Some(bt) = e.downcast_ref::<wasmtime::WasmBacktrace>() {
        let frames = bt.frames();
        let panic = frames.iter().take_while(|f| f.func_name().is_some_and(is_panic_runtime)).count();
        let names: Vec<String> = frames[panic..]
            .iter()
            .take(FAULT_FRAMES)
            .map(|f| f.func_name().map_or_else(|| format!("func[{}]", f.func_index()), str::to_owned))
            .collect();
        if !names.is_empty() {
            s.push_str(if panic > 0 { "; panic in " } else { "; at " });
            s.push_str(&names.join(" < "));
        }
        if frames.len() > panic + names.len() {
            s.push_str(&format!(" (+{} frames)", frames.len() - panic - names.len()));
        }
    }
    s
}

/// Whether a (mangled or plain) function name is Rust's panic machinery.
fn is_panic_runtime(name: &str) -> bool {
    ["rust_panic", "rust_abort", "rust_start_panic", "rust_begin_unwind", "panicking", "panic_fmt", "panic_handler"]
        .iter()
        .any(|p| name.contains(p))
}

/// A plugin instance owned by one worker: a [`VerdictStage`] making one call per batch.
pub struct WasmStage {
    /// Makes a fresh instance after a fault.
    pub(crate) factory: Arc<PluginFactory>,
    pub(crate) worker: usize,
    /// `None` after a fault until a fresh instance is made (at the next batch).
    pub(crate) live: Option<Live>,
    /// How its log lines name it (the spec's label, until a promote makes a shadow plugin live).
    pub(crate) label: Arc<str>,
    pub(crate) stats: Arc<PluginStats>,
    /// What the instance counted before its install, when `stats` are shared with the stage
    /// it replaces (see [`PluginFactory::instantiate_with_stats`]).
    pub(crate) staged: Option<Arc<PluginStats>>,
    pub(crate) faults: u32,
    pub(crate) quarantined: bool,
    /// Until the install (see [`PluginFactory::instantiate_with_stats`]).
    pub(crate) fresh: bool,
    /// The log gate while no instance is live (after a fault); see [`HostState::log`].
    pub(crate) log: LogGate,
    /// The encoded batch, reused.
    pub(crate) buf: Vec<u8>,
    pub(crate) ticks: u64,
    /// Calls left to measure in CPU time (see [`CPU_WATCH_CALLS`]).
    pub(crate) cpu_watch: u32,
    /// How many calls the next unmeasured overrun makes measured: 0 before the first, then
    /// doubled by each (see [`CPU_WATCH_CALLS`]).
    pub(crate) cpu_watch_len: u32,
}

impl WasmStage {
    /// The counters it counts into (the replaced stage's, when made by
    /// [`PluginFactory::instantiate_with_stats`]).
    pub fn stats(&self) -> &Arc<PluginStats> {
        &self.stats
    }

    /// The plugin's name ([`PluginSpec::name`]).
    pub fn name(&self) -> &str {
        &self.factory.spec.name
    }

    /// How its log lines name it (see [`WasmStage::relabel`]).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether it faulted `max_faults` times on this worker: skipped, its batches given the
    /// `on_error` policy, until a reload ([`WasmStage::lift_quarantine`] or a new stage).
    pub fn is_quarantined(&self) -> bool {
        self.quarantined
    }

    /// Whether an instance is live (`false` between a fault and the next batch's remake).
    pub fn has_instance(&self) -> bool {
        self.live.is_some()
    }

    /// The index of the worker it was made for (`worker N` in its log lines).
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// The compiled plugin it was made from (and remakes its instance from after a fault).
    pub fn factory(&self) -> &Arc<PluginFactory> {
        &self.factory
    }

    /// Makes this stage the one counting into its stats (worker only: when it replaces the
    /// running stage, or at its first batch): what its instance counted in staging is added,
    /// and its counter ids are mapped where they differ; a quarantine of the stage it replaces
    /// is lifted (counted in `quarantine_lifted`). Once; later calls do nothing.
    pub fn install(&mut self) {
        if !std::mem::take(&mut self.fresh) {
            return;
        }
        if let Some(staged) = self.staged.take() {
            let ids = self.stats.absorb_staged(&staged);
            // The staged instance's ids are the staging table's.
            let names = staged.named.names();
            let lost = ids.iter().flatten().zip(&names).filter(|(&id, _)| id == u32::MAX).map(|(_, n)| n.clone());
            self.warn_unplaced(lost.collect());
            if let Some(live) = self.live.as_mut() {
                let state = live.store.data_mut();
                state.stats = self.stats.clone();
                state.counter_ids = ids;
            }
        }
        if self.stats.quarantined.get() != 0 {
            self.stats.quarantine_lifted.inc();
            self.stats.quarantined.set(0);
        }
    }

    /// Names the stage in its log lines as the plugin at `context` (``port `p0` ``): a promoted
    /// shadow plugin, whose spec says it runs in the shadow chain.
    pub fn relabel(&mut self, context: &str) {
        self.label = self.factory.spec.label_at(context).into();
        if let Some(live) = self.live.as_mut() {
            live.store.data_mut().name = self.label.clone();
        }
    }

    /// Makes this stage count into `stats` from now on (worker only): a promoted shadow plugin
    /// going on with the counters of the live plugin of its name, whose series must neither go
    /// backwards nor take in the batches this one ran as a shadow (those stay in its own,
    /// which stop). The instance's counter ids are mapped to the names of `stats`, registered
    /// there as needed; the `quarantined` gauge becomes this stage's.
    pub fn count_into(&mut self, stats: Arc<PluginStats>) {
        self.install();
        let names = self.stats.named.names();
        // The live plugin's names this one does not have end with it (see `absorb_staged`).
        stats.named.retain(&names);
        let mut lost = Vec::new();
        if let Some(live) = self.live.as_mut() {
            let state = live.store.data_mut();
            let guest_ids = state.counter_ids.as_ref().map_or(names.len(), Vec::len) as u32;
            let ids: Vec<u32> = (0..guest_ids)
                .map(|g| {
                    let here = crate::stats::counter_id(state.counter_ids.as_deref(), g);
                    let Some(name) = names.get(here as usize) else { return u32::MAX };
                    stats.named.register(name).unwrap_or_else(|_| {
                        lost.push(name.clone());
                        u32::MAX
                    })
                })
                .collect();
            state.counter_ids = crate::stats::id_map(ids);
            state.stats = stats.clone();
        }
        // The live one's quarantine ends here, counted as a reload's lift would be.
        if stats.quarantined.get() != 0 && !self.quarantined {
            stats.quarantine_lifted.inc();
        }
        stats.quarantined.set(u64::from(self.quarantined));
        self.stats = stats;
        self.warn_unplaced(lost);
    }

    /// Warns of the counters that found no room in the stats this stage now counts into (at
    /// most [`MAX_NAMED`] names; those of the stage replaced that this one lacks are let go
    /// first, so this is a safeguard).
    fn warn_unplaced(&self, lost: Vec<String>) {
        if !lost.is_empty() {
            log::warn!(
                target: "wasmswitch::plugin",
                "{} (worker {}): no room for counter(s) {} among the {MAX_NAMED} names its counters keep; their counts are dropped until a restart",
                self.label,
                self.worker,
                lost.join(", ")
            );
        }
    }

    /// What a reload does to a plugin it keeps (same component and config): the instance
    /// and its state stay, the fault count starts again, and a quarantine is lifted (counted
    /// in `quarantine_lifted`), as for a plugin the reload loads afresh. Worker only.
    pub fn lift_quarantine(&mut self) {
        self.faults = 0;
        if self.quarantined || self.stats.quarantined.get() != 0 {
            self.quarantined = false;
            self.stats.quarantined.set(0);
            self.stats.quarantine_lifted.inc();
        }
    }

    /// Bytes of all linear memories of the live instance together (what `memory_limit`
    /// caps); `None` between a fault and the next batch.
    pub fn memory_bytes(&self) -> Option<usize> {
        self.live.as_ref().map(|l| l.store.data().limiter.memory_bytes)
    }

    pub(crate) fn apply_policy(&self, verdicts: &mut [Verdict]) {
        self.stats.policy_packets.add(verdicts.len() as u64);
        if self.factory.spec.on_error == OnError::Drop {
            verdicts.fill(Verdict::Drop);
            self.stats.verdict_drop.add(verdicts.len() as u64);
        } else {
            self.stats.verdict_pass.add(verdicts.len() as u64);
        }
    }

    pub(crate) fn fault(&mut self, reason: FaultReason, why: &str, verdicts: &mut [Verdict]) {
        if let Some(live) = self.live.take() {
            self.log = live.store.into_data().log;
        }
        self.faults += 1;
        self.stats.faults(reason).inc();
        verdicts.fill(Verdict::Pass);
        self.apply_policy(verdicts);
        let spec = &self.factory.spec;
        // The quarantine line below is written whatever the gate says: it comes once.
        let label = &self.label;
        if self.log.admit(&self.stats, label, self.worker) {
            log::warn!(
            target: "wasmswitch::plugin",
            "{} (worker {}): fault {}/{} ({}): {}; on_error {:?} applied to {} packets",
            label,
            self.worker,
            self.faults,
            spec.max_faults,
            reason.as_str(),
            why,
            spec.on_error,
            verdicts.len()
            );
        }
        if self.faults >= spec.max_faults {
            self.quarantined = true;
            self.stats.quarantined.set(1);
            log::error!(target: "wasmswitch::plugin", "{label} (worker {}): quarantined after {} faults; on_error {:?} applies until it is reloaded", self.worker, self.faults, spec.on_error);
        }
    }

    pub(crate) fn call(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
        let header_bytes = self.factory.spec.header_bytes as usize;
        let unseen = encode_batch(batch, header_bytes, &mut self.buf);
        self.call_encoded(verdicts);
        if unseen > 0 {
            // Whatever the plugin (or its on_error policy, after a fault) answered.
            drop_ports_unseen(batch, header_bytes, verdicts, &self.stats);
        }
    }

    /// The call on the batch [`encode_batch`] wrote into `self.buf`.
    #[inline(always)]
    fn call_encoded(&mut self, verdicts: &mut [Verdict]) {
        if self.live.is_none() {
            let label = self.label.clone();
            match self.factory.new_instance(
                self.worker,
                label,
                self.stats.clone(),
                &mut self.log,
                self.factory.spec.deadline,
            ) {
                Ok(l) => {
                    self.stats.reinstantiations.inc();
                    self.live = Some(l);
                }
                Err(e) => return self.fault(FaultReason::Instantiate, &e.message, verdicts),
            }
        }
        let Some(live) = self.live.as_mut() else { return };
        let clock = &self.factory.engine.ticks;
        let watch = (self.cpu_watch > 0).then(|| {
            self.cpu_watch -= 1;
            CpuWatch::start(self.factory.engine.opts.epoch_tick * self.ticks as u32)
        });
        let measured = watch.is_some();
        let start = clock.load(Ordering::Relaxed);
        let result = live.process(self.ticks, &self.buf, verdicts, &self.stats, watch);
        // More ticks than twice the deadline, plus the one a call may start just before.
        if clock.load(Ordering::Relaxed).wrapping_sub(start) > 2 * self.ticks + 1 {
            self.wall_overrun(measured);
        }
        if let Err((reason, why)) = result {
            self.fault(reason, &why, verdicts);
        }
    }

    /// A call's wall time passed twice its deadline: the worker was descheduled, or the guest
    /// ran code no epoch check stops. A measured call has had its CPU time judged; after one
    /// that was not, the next calls are measured, more of them each time.
    #[cold]
    fn wall_overrun(&mut self, measured: bool) {
        self.stats.wall_overruns.inc();
        if !measured {
            self.cpu_watch_len =
                if self.cpu_watch_len == 0 { CPU_WATCH_CALLS } else { self.cpu_watch_len.saturating_mul(2) };
        }
        self.cpu_watch = self.cpu_watch.max(self.cpu_watch_len);
    }
}

impl Live {
    /// One `process` call on an encoded batch under the deadline of `ticks`: the verdicts
    /// into `verdicts` (counted into `stats`), or why the call failed. After an `Err` the
    /// instance must not be called again.
    #[inline]
    pub(crate) fn process(
        &mut self,
        ticks: u64,
        batch: &[u8],
        verdicts: &mut [Verdict],
        stats: &PluginStats,
        watch: Option<CpuWatch>,
    ) -> Result<(), (FaultReason, String)> {
        self.store.set_epoch_deadline(ticks);
        let state = self.store.data_mut();
        state.limiter.denied = None;
        state.deadline.arm();
        // SAFETY: `self.process` was checked with `Func::typed::<(&[u8],), (WasmList<u8>,)>`
        // when this instance was created (`new_instance`); the parameter lifetime is the only
        // difference, and it is not part of the component type. Re-checking per batch would
        // cost a type comparison on every call.
        let f: ProcessFn<'_> = unsafe { TypedFunc::new_unchecked(self.process) };
        match f.call(&mut self.store, (batch,)) {
            Ok((list,)) => {
                if let Some(w) = watch {
                    w.check()?;
                }
                let ids = self.store.data().counter_ids.as_deref();
                decode_verdicts(list.as_le_slice(&self.store), verdicts, stats, ids)
                    .map_err(|m| (FaultReason::BadOutput, m))
            }
            Err(e) => Err(describe_fault(&e, &self.store)),
        }
    }
}

impl Drop for WasmStage {
    /// A stage replaced (a reload, a promote) or ended while its log lines were being limited
    /// says how many it suppressed since the last line let through, as its next line would
    /// have: the count is in `log_suppressed_total` either way, the line says whose.
    fn drop(&mut self) {
        let gate = self.live.as_ref().map_or(&self.log, |l| &l.store.data().log);
        if gate.suppressed > 0 {
            log::warn!(
                target: "wasmswitch::plugin",
                "{} ({}): {} log lines suppressed (its last: the instance was replaced or stopped)",
                self.label,
                On(self.worker),
                gate.suppressed
            );
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
        if self.fresh {
            self.install();
        }
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
