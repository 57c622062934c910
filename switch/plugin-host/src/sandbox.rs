//! Everything a plugin instance runs inside: its `Store` data, the CPU-time deadline watch, the
//! memory limiter and the rate-limited `log` host function.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{ComponentType, Lift, WasmStr};
use wasmtime::StoreContextMut;

use crate::deadline::{deadline_ticks, thread_cpu_time};
use crate::stats::{PluginStats, MAX_NAMED};
use crate::text::one_line;

/// The WIT `level` enum (constructed by lifting from the guest, hence no Rust constructor).
#[allow(dead_code)]
#[derive(ComponentType, Lift, Clone, Copy, Debug)]
#[component(enum)]
#[repr(u8)]
pub(crate) enum Level {
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
    pub(crate) name: Arc<str>,
    pub(crate) worker: usize,
    pub(crate) stats: Arc<PluginStats>,
    /// The instance's counter ids as `stats` numbers them, when they differ (an instance that
    /// registered its counters in staging; see [`PluginStats::absorb_staged`]).
    pub(crate) counter_ids: Option<Vec<u32>>,
    pub(crate) limiter: Limiter,
    /// The plugin's log lines and the host's fault warnings for it, on this worker. Carried
    /// over to the fresh instance after a fault, so a plugin that faults in a loop does not
    /// get a fresh burst each time.
    pub(crate) log: LogGate,
    pub(crate) clock_base: Instant,
    pub(crate) deadline: DeadlineWatch,
}

impl HostState {
    /// The id the guest is given for counter `id` of `stats` (`register-counter`'s answer).
    pub(crate) fn guest_counter_id(&mut self, id: u32) -> Result<u32, String> {
        let Some(ids) = &mut self.counter_ids else { return Ok(id) };
        // Mapped ids: the guest's id is its position in the map; a new name takes the next,
        // within the ids a guest may use.
        match ids.iter().position(|&i| i == id) {
            Some(mine) => Ok(mine as u32),
            None if ids.len() >= MAX_NAMED => Err(format!("too many counters (at most {MAX_NAMED})")),
            None => {
                ids.push(id);
                Ok(ids.len() as u32 - 1)
            }
        }
    }

    /// The guest's `counter-add`.
    pub(crate) fn counter_add(&self, id: u32, delta: u64) {
        self.stats.named.add(crate::stats::counter_id(self.counter_ids.as_deref(), id), delta);
    }
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
pub(crate) struct DeadlineWatch {
    /// Deadline in epoch ticks (the period).
    pub(crate) ticks: u64,
    pub(crate) cpu_budget: Duration,
    /// Thread CPU time at the first expiry in the current call.
    pub(crate) cpu_mark: Option<Duration>,
    pub(crate) extensions: u32,
    /// Note the CPU time when armed rather than at the first expiry: for `init`, whose bound
    /// is a promise ("may use 1000 ms"), checked every quarter of it (see
    /// [`DeadlineWatch::for_init`]).
    pub(crate) mark_at_arm: bool,
}

pub(crate) const MAX_STALL_EXTENSIONS: u32 = 16;

impl DeadlineWatch {
    /// A watch for batch calls under `ticks` (the deadline as enforced) and `deadline`.
    pub(crate) fn for_calls(ticks: u64, deadline: Duration) -> Self {
        Self { ticks, cpu_budget: deadline, cpu_mark: None, extensions: 0, mark_at_arm: false }
    }

    /// A watch for instantiation and `init` under `bound` of CPU: the CPU clock is noted when
    /// armed and checked every quarter of the bound, so a spinning init is stopped after
    /// `bound` to 1.25 × `bound` of CPU (a batch call's watch, noting at the first expiry,
    /// allows up to twice its deadline).
    pub(crate) fn for_init(bound: Duration, tick: Duration) -> Self {
        let ticks = deadline_ticks(bound / 4, tick);
        // `expired` interrupts at half the budget since the mark.
        Self { ticks, cpu_budget: bound * 2, cpu_mark: None, extensions: 0, mark_at_arm: true }
    }

    /// The CPU time a call may use, as error messages state it.
    pub(crate) fn bound(&self) -> Duration {
        if self.mark_at_arm {
            self.cpu_budget / 2
        } else {
            self.cpu_budget
        }
    }

    /// Called before every call (two stores, and a branch never taken on batch calls).
    #[inline]
    pub(crate) fn arm(&mut self) {
        self.cpu_mark = if self.mark_at_arm { Some(thread_cpu_time()) } else { None };
        self.extensions = 0;
    }

    pub(crate) fn expired(&mut self) -> wasmtime::UpdateDeadline {
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

/// How a log line names the instance it is about: `worker N`, or `check` for the instances
/// the control thread makes for no worker (the check run at load, `wasmswitch check`'s smoke
/// run), which are numbered `usize::MAX`.
pub(crate) struct On(pub(crate) usize);

impl fmt::Display for On {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            usize::MAX => f.write_str("check"),
            w => write!(f, "worker {w}"),
        }
    }
}

/// Lines one plugin may log on one worker at once, then [`LOG_PER_SEC`] lines per second.
pub(crate) const LOG_BURST: f64 = 10.0;
pub(crate) const LOG_PER_SEC: f64 = 1.0;
pub(crate) const LOG_MAX_LEN: usize = 512;

/// A token bucket over one plugin's lines on one worker (its `log` calls and the host's fault
/// warnings about it): a plugin logging per packet, or faulting on every batch, would
/// otherwise write thousands of lines a second. Dropped lines are counted in
/// `PluginStats::log_suppressed`; one line says when suppression starts and one how many
/// were dropped when it ends (at the next line let through).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogGate {
    pub(crate) tokens: f64,
    pub(crate) last: Instant,
    /// Lines dropped since the last one let through.
    pub(crate) suppressed: u64,
}

impl LogGate {
    pub(crate) fn new() -> Self {
        Self { tokens: LOG_BURST, last: Instant::now(), suppressed: 0 }
    }

    /// Whether a line about plugin `name` may be written now (the worker's thread only).
    pub(crate) fn admit(&mut self, stats: &PluginStats, name: &str, worker: usize) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * LOG_PER_SEC).min(LOG_BURST);
        self.last = now;
        if self.tokens < 1.0 {
            if self.suppressed == 0 {
                log::warn!(
                    target: "wasmswitch::plugin",
                    "{name} ({}): too many log lines ({LOG_BURST} at once, then {LOG_PER_SEC}/s); suppressing, counted in wasmswitch_plugin_log_suppressed_total",
                    On(worker)
                );
            }
            self.suppressed += 1;
            stats.log_suppressed.inc();
            return false;
        }
        self.tokens -= 1.0;
        if self.suppressed > 0 {
            log::warn!(target: "wasmswitch::plugin", "{name} ({}): {} log lines suppressed", On(worker), self.suppressed);
            self.suppressed = 0;
        }
        true
    }
}

/// Most table elements of one instance, all tables together (the function tables of real
/// plugins hold hundreds).
pub(crate) const MAX_TABLE_ELEMENTS: usize = 65_536;

/// The store's limits. wasmtime asks per memory and per table; the sums here make
/// `memory_limit` a cap on the whole instance (a component may have several memories, and
/// each one under the limit could add up to a multiple of it).
pub(crate) struct Limiter {
    pub(crate) max_memory: usize,
    /// Bytes of every linear memory of the instance together. Memories never shrink and
    /// live as long as the store, so this only grows.
    pub(crate) memory_bytes: usize,
    /// Elements of every table together.
    pub(crate) table_elements: usize,
    /// Set when a memory.grow was refused during the current call.
    pub(crate) denied: Option<Refusal>,
}

/// Why a memory.grow was refused: either way the guest ran out of memory, and a trap that
/// follows is a memory fault, not a bug in its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The plugin's `memory_limit_kib` (all its memories together).
    Limit,
    /// The memory's own declared maximum (or wasm32's 4 GiB), in bytes.
    OwnMaximum(usize),
}

impl Limiter {
    pub(crate) fn new(max_memory: usize) -> Self {
        Self { max_memory, memory_bytes: 0, table_elements: 0, denied: None }
    }

    /// The refusal in words, for a fault or an instantiation error.
    pub(crate) fn refusal_text(&self) -> Option<String> {
        self.denied.map(|r| match r {
            Refusal::Limit => {
                format!("memory limit of {} bytes reached ({} bytes in use)", self.max_memory, self.memory_bytes)
            }
            Refusal::OwnMaximum(m) => format!("the memory's own maximum of {m} bytes reached"),
        })
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        // wasmtime refuses a growth past the memory's declared maximum only after asking us;
        // refuse it here, uncounted, so the sum stays exact. The configured limit is named
        // first when both are passed: it is the one the operator can change.
        let total = self.memory_bytes.saturating_add(desired.saturating_sub(current));
        if total > self.max_memory {
            self.denied = Some(Refusal::Limit);
            return Ok(false);
        }
        if let Some(m) = maximum.filter(|&m| desired > m) {
            self.denied = Some(Refusal::OwnMaximum(m));
            return Ok(false);
        }
        // A growth allowed here can still fail in the allocator; the sum then counts bytes
        // the instance does not have, which errs on the safe side.
        self.memory_bytes = total;
        Ok(true)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|m| desired > m) {
            return Ok(false);
        }
        let total = self.table_elements.saturating_add(desired.saturating_sub(current));
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
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

pub(crate) fn host_log(mut cx: StoreContextMut<'_, HostState>, (level, msg): (Level, WasmStr)) -> wasmtime::Result<()> {
    let s = cx.data_mut();
    let (name, worker) = (s.name.clone(), s.worker);
    if !s.log.admit(&s.stats, &name, worker) {
        return Ok(());
    }
    let text = one_line(&msg.to_str(&cx)?, LOG_MAX_LEN);
    let level = match level {
        Level::Error => log::Level::Error,
        Level::Warn => log::Level::Warn,
        Level::Info => log::Level::Info,
        Level::Debug => log::Level::Debug,
    };
    log::log!(target: "wasmswitch::plugin", level, "{name} ({}): {text}", On(worker));
    Ok(())
}
