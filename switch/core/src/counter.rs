//! Single-writer counters.
//!
//! Each worker owns its counters and is the only thread that writes them; the metrics scrape
//! reads them from another thread and sums across workers. A relaxed load + store (not a
//! read-modify-write) compiles to plain moves on x86 and never bounces a cache line between
//! writers, which is what lets the hot path count freely.

use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter written by exactly one thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Must only be called by the counter's owning thread.
    #[inline]
    pub fn add(&self, n: u64) {
        // Not fetch_add: there is one writer, so load+store is exact and avoids a locked op.
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Adds `n`, stopping at `u64::MAX`: for amounts someone else states (a plugin's counter
    /// deltas), where a wrapping sum could make the counter go backwards.
    #[inline]
    pub fn add_saturating(&self, n: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).saturating_add(n), Ordering::Relaxed);
    }

    /// Adds 1. Must only be called by the counter's owning thread.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Reads the current value (any thread).
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Starts again from zero (the owning thread only: a port id handed to a new port).
    pub fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// A gauge written by one thread (a level, not a total).
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the level. Must only be called by the gauge's owning thread.
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// Reads the current level (any thread).
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Reads the CPU's time-stamp counter: the clock for busy cycles per packet.
#[inline]
#[cfg_attr(
    not(target_arch = "x86_64"),
    expect(clippy::cast_possible_truncation, reason = "u64 nanoseconds since the first call last 584 years")
)]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no memory effects and is available on every x86_64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::time::Instant;
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_adds() {
        let c = Counter::default();
        c.add(5);
        c.inc();
        assert_eq!(c.get(), 6);
    }
}
