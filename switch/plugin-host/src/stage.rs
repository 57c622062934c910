//! A compiled plugin ([`PluginFactory`]) and its per-worker instances ([`WasmStage`]): one
//! component call per batch, faults, quarantine.

use super::*;

/// A compiled, linked, checked plugin: makes one [`WasmStage`] per worker. `Send + Sync`.
pub struct PluginFactory {
    pub(crate) engine: Arc<PluginEngine>,
    pub(crate) spec: PluginSpec,
    pub(crate) pre: InstancePre<HostState>,
    pub(crate) from_cache: bool,
}

/// The exports of one live instance.
pub(crate) struct Live {
    pub(crate) store: Store<HostState>,
    pub(crate) process: Func,
}

pub(crate) type InitFn = TypedFunc<(&'static str,), (Result<(), String>,)>;
pub(crate) type ProcessFn<'a> = TypedFunc<(&'a [u8],), (WasmList<u8>,)>;

impl PluginFactory {
    pub fn spec(&self) -> &PluginSpec {
        &self.spec
    }

    /// Whether the compiled code came from the cache directory (no compilation).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    pub(crate) fn new_instance(&self, worker: usize, stats: Arc<PluginStats>) -> Result<Live, PluginError> {
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

pub(crate) fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    (deadline.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64).max(1) + 1
}

/// Classifies a failed call.
pub(crate) fn describe_fault(e: &wasmtime::Error, store: &Store<HostState>) -> (FaultReason, String) {
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
    pub(crate) factory: Arc<PluginFactory>,
    pub(crate) worker: usize,
    /// `None` after a fault until a fresh instance is made (at the next batch).
    pub(crate) live: Option<Live>,
    pub(crate) stats: Arc<PluginStats>,
    pub(crate) faults: u32,
    pub(crate) quarantined: bool,
    /// The encoded batch, reused.
    pub(crate) buf: Vec<u8>,
    pub(crate) ticks: u64,
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

    pub(crate) fn call(&mut self, batch: &BatchView<'_>, verdicts: &mut [Verdict]) {
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
