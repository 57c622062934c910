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
//! `wasmswitch check` also runs [`PluginFactory::smoke`]: a fresh instance over built-in
//! frames of every kind, under the plugin's limits, so a plugin that faults on some kind of
//! frame fails the check instead of its first batch in production.
//!
//! The call shape (why `list<u8>` in and out, hand-written guest glue, no post-return) is
//! explained in `plugins/sdk/src/rt.rs` and `plugins/README.md`, with measurements.

// A library's `pub` is what other crates may use; the rest says `pub(crate)`.
#![warn(unreachable_pub)]
#![warn(missing_docs)]

mod cache;
mod codec;
mod deadline;
mod engine;
mod sandbox;
mod smoke;
mod spec;
mod stage;
mod stats;
mod text;

pub use cache::{check_dir, hmac_sha256, CacheKey, CacheStats, CompileCache, Discard, KEY_FILE};
pub use codec::{decode_verdicts, drop_ports_unseen, encode_batch, ports_unseen, NativeStage};
pub use deadline::{deadline_as_enforced, CPU_WATCH_CALLS, EPOCH_TICK, INIT_DEADLINE};
pub use engine::{read_regular_file, EngineOptions, PluginEngine, MAX_PLUGIN_BYTES};
pub use sandbox::HostState;
pub use smoke::{smoke_frames, SlowestBatch, SmokeFrame, SmokeReport, NEAR_DEADLINE};
pub use spec::{Bytes, ErrorKind, OnError, PluginError, PluginSpec};
pub use stage::{stage_from_file, PluginFactory, WasmStage};
pub use stats::{FaultReason, NamedCounters, PluginStats, MAX_NAMED};
pub use wasmswitch_plugin_sdk;

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use wasmtime::UpdateDeadline;

    use super::*;
    use crate::deadline::thread_cpu_time;
    use crate::sandbox::{DeadlineWatch, LogGate, MAX_STALL_EXTENSIONS};

    fn spin_cpu(d: Duration) {
        let t = thread_cpu_time();
        while thread_cpu_time().saturating_sub(t) < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn deadline_watch_tells_a_stall_from_a_spin() {
        let mut w = DeadlineWatch::for_calls(3, Duration::from_millis(10));
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
    fn log_gate_lets_a_burst_through_then_one_a_second() {
        let stats = PluginStats::default();
        let mut g = LogGate::new();
        let through = (0..50).filter(|_| g.admit(&stats, "p", 0)).count();
        assert_eq!((through, stats.log_suppressed.get(), g.suppressed), (10, 40, 40));
        // Two seconds later: two lines; the first one ends the suppression.
        g.last -= Duration::from_secs(2);
        assert!(g.admit(&stats, "p", 0) && g.suppressed == 0);
        assert!(g.admit(&stats, "p", 0));
        assert!(!g.admit(&stats, "p", 0));
        assert_eq!(stats.log_suppressed.get(), 41);
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
