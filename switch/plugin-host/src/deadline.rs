//! A plugin call's deadline: the epoch tick it is enforced on, how many ticks a deadline
//! becomes, and the thread-CPU watch that catches what no epoch check stops. One place for
//! what the engine (epoch thread), the stage (arming each call) and the sandbox (the epoch
//! callback) all need.

use std::time::Duration;

use crate::stats::FaultReason;

/// The default epoch tick: the clock a plugin's deadline is enforced on.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// The time a call may run before its deadline first fires, on the default tick: `deadline`
/// rounded up to whole ticks, plus one (the call may start just before a tick). A call that
/// keeps using CPU is interrupted at the second firing, so at most twice this.
pub fn deadline_as_enforced(deadline: Duration) -> Duration {
    EPOCH_TICK * deadline_ticks(deadline, EPOCH_TICK) as u32
}

/// CPU time instantiation and `init` may use off the data path: the check run at load and
/// each worker's instance, made by the control thread at start and on reload. The fresh
/// instance after a fault is made on the worker, under the plugin's batch deadline.
pub const INIT_DEADLINE: Duration = Duration::from_secs(1);

/// Ticks a call may run for a `deadline` on a clock of `tick`: whole ticks, rounded up, plus one
/// (the call may start just before a tick).
pub(crate) fn deadline_ticks(deadline: Duration, tick: Duration) -> u64 {
    (deadline.as_nanos().div_ceil(tick.as_nanos().max(1)) as u64).max(1) + 1
}

/// CPU time of the calling thread (a syscall: `CLOCK_THREAD_CPUTIME_ID` has no vDSO path).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a live, writable timespec; the clock id is a constant the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Calls measured in thread CPU time after one whose wall time passed twice its deadline.
/// Epoch checks stop a call only at function entries and loop headers, so a single bulk
/// memory instruction (`memory.fill` or `memory.copy` over most of a large memory) runs to its
/// end however long it takes. Such a call is seen after it returns, by the epoch tick count,
/// which costs one load per call; but that is wall time, which a descheduled worker also
/// spends. So the next calls read the thread's CPU clock before and after (two syscalls, some
/// 1 µs: too dear for every batch), and one that used more than twice its deadline of CPU is
/// a `deadline` fault. Each overrun on a call that was not measured doubles how many calls the
/// next watch measures, for the instance's life: a plugin that overruns once per watch, just
/// after each ends, would otherwise stall its worker that often and never be faulted.
pub const CPU_WATCH_CALLS: u32 = 64;

/// A call measured in thread CPU time (see [`CPU_WATCH_CALLS`]).
pub(crate) struct CpuWatch {
    start: Duration,
    /// Twice the deadline as enforced: the most an epoch-interrupted call can use.
    cap: Duration,
}

impl CpuWatch {
    /// Starts measuring a call whose deadline, as enforced (whole epoch ticks, see
    /// [`crate::deadline_as_enforced`]), is `enforced`.
    pub(crate) fn start(enforced: Duration) -> Self {
        Self::since(thread_cpu_time(), enforced)
    }

    /// A watch over what the thread has run since its CPU clock read `start`.
    pub(crate) fn since(start: Duration, enforced: Duration) -> Self {
        Self { start, cap: enforced * 2 }
    }

    pub(crate) fn used(&self) -> Duration {
        thread_cpu_time().saturating_sub(self.start)
    }

    /// Whether the thread has used more than the cap since the start.
    pub(crate) fn over(&self) -> bool {
        self.used() > self.cap
    }

    pub(crate) fn check(&self) -> Result<(), (FaultReason, String)> {
        let used = self.used();
        if used <= self.cap {
            return Ok(());
        }
        Err((
            FaultReason::Deadline,
            format!(
                "the call used {} µs of CPU, more than twice its deadline as enforced ({} µs), in code no epoch check stops (one bulk memory instruction over a large memory?)",
                used.as_micros(),
                self.cap.as_micros() / 2
            ),
        ))
    }
}
