//! Everything a plugin instance runs inside: its `Store` data, the CPU-time deadline watch, the
//! memory limiter and the rate-limited `log` host function.

use super::*;

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
    pub(crate) limiter: Limiter,
    /// Log token bucket: tokens, last refill.
    pub(crate) log_tokens: f64,
    pub(crate) log_last: Instant,
    pub(crate) clock_base: Instant,
    pub(crate) deadline: DeadlineWatch,
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
}

pub(crate) const MAX_STALL_EXTENSIONS: u32 = 16;

impl DeadlineWatch {
    /// Called before every call (two stores).
    #[inline]
    pub(crate) fn arm(&mut self) {
        self.cpu_mark = None;
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

/// CPU time of the calling thread (a syscall: `CLOCK_THREAD_CPUTIME_ID` has no vDSO path).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a live, writable timespec; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

pub(crate) const LOG_BURST: f64 = 20.0;
pub(crate) const LOG_PER_SEC: f64 = 10.0;
pub(crate) const LOG_MAX_LEN: usize = 512;

pub(crate) struct Limiter {
    pub(crate) max_memory: usize,
    /// Set when a memory.grow was refused during the current call.
    pub(crate) denied: bool,
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

pub(crate) fn host_log(mut cx: StoreContextMut<'_, HostState>, (level, msg): (Level, WasmStr)) -> wasmtime::Result<()> {
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
