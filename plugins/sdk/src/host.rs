//! What the switch offers a plugin: logging, named counters and a monotonic clock.
//!
//! In a Wasm build these call the `wasmswitch:plugin/host` imports. In a native build (unit
//! tests, the host's native comparison stage) they go to a per-thread recorder that
//! [`crate::harness`] can inspect.

use std::cell::RefCell;

/// Log severity (the WIT `level` enum, same order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Level {
    /// Logged at the switch's `error` level.
    Error = 0,
    /// Logged at the switch's `warn` level.
    Warn = 1,
    /// Logged at the switch's `info` level.
    Info = 2,
    /// Logged at the switch's `debug` level, shown only when its log filter enables it; the line
    /// still counts toward the per-plugin rate limit when hidden.
    Debug = 3,
}

/// Most counters one plugin instance may register (the host enforces the same limit).
pub const MAX_COUNTERS: usize = 64;

/// Deltas not yet handed to the host, by counter id. The runtime appends them to the batch's
/// result (the counter-delta trailer of `wit/plugin.wit`), so `Counter::add` per packet costs
/// an add, and a batch costs no host call at all for its counters.
struct Pending {
    deltas: [u64; MAX_COUNTERS],
    high: usize,
}

thread_local! {
    // Wasm guests are single-threaded, so this is just a static there.
    static PENDING: RefCell<Pending> = const { RefCell::new(Pending { deltas: [0; MAX_COUNTERS], high: 0 }) };
}

/// A named counter exported on the switch's `/metrics`. Register it in `Plugin::init`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    id: u32,
}

impl Counter {
    /// Registers (or finds) the counter `name` (`[a-z0-9_]{1,64}`).
    pub fn register(name: &str) -> Result<Counter, String> {
        let id = backend::register_counter(name)?;
        if id as usize >= MAX_COUNTERS {
            return Err(format!("counter id {id} out of range"));
        }
        Ok(Counter { id })
    }

    /// Adds `n`. Cheap: accumulated in the guest and handed to the host with the batch's
    /// verdicts.
    #[inline]
    pub fn add(&self, n: u64) {
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let i = self.id as usize;
            p.deltas[i] = p.deltas[i].wrapping_add(n);
            if i >= p.high {
                p.high = i + 1;
            }
        });
    }

    /// Adds 1, as cheaply as [`Counter::add`].
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
}

/// Takes every non-zero pending delta, in id order, handing each to `f`.
fn drain_pending(mut f: impl FnMut(u32, u64)) {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let high = p.high;
        for id in 0..high {
            let d = std::mem::take(&mut p.deltas[id]);
            if d != 0 {
                f(id as u32, d);
            }
        }
        p.high = 0;
    });
}

/// Moves the accumulated counter deltas into `out` as counter-delta records (the runtime
/// calls this after every batch, after the verdicts; see `abi::split_result`).
pub fn append_counter_deltas(out: &mut Vec<u8>) {
    drain_pending(|id, d| crate::abi::push_counter_delta(out, id, d));
}

/// Hands accumulated counter deltas to the host with one `counter-add` call each. The
/// runtime calls this after `init`, where there is no batch result to carry them.
pub fn flush_counters() {
    drain_pending(backend::counter_add);
}

/// Writes a log line (rate limited by the host).
pub fn log(level: Level, message: &str) {
    backend::log(level, message);
}

/// Nanoseconds on a monotonic clock; only differences are meaningful.
#[inline]
pub fn now_ns() -> u64 {
    backend::now_ns()
}

#[cfg(target_arch = "wasm32")]
mod backend {
    use super::Level;

    #[link(wasm_import_module = "wasmswitch:plugin/host@0.2.0")]
    unsafe extern "C" {
        #[link_name = "log"]
        fn host_log(level: i32, ptr: *const u8, len: usize);
        #[link_name = "register-counter"]
        fn host_register_counter(ptr: *const u8, len: usize, ret: *mut u32);
        #[link_name = "counter-add"]
        fn host_counter_add(id: i32, delta: i64);
        #[link_name = "now-ns"]
        fn host_now_ns() -> i64;
    }

    pub(crate) fn log(level: Level, message: &str) {
        // SAFETY: the canonical ABI lifts (ptr, len) as a string; both come from a live &str.
        unsafe { host_log(level as i32, message.as_ptr(), message.len()) }
    }

    pub(crate) fn register_counter(name: &str) -> Result<u32, String> {
        // result<u32, string> flattens to 3 values (> 1 result), so the callee writes it to a
        // return area: discriminant byte at 0, then the u32 or (ptr, len) at 4 and 8.
        let mut ret = [0u32; 3];
        // SAFETY: (ptr, len) come from a live &str; `ret` is a 12-byte, 4-aligned return area.
        unsafe { host_register_counter(name.as_ptr(), name.len(), ret.as_mut_ptr()) };
        if ret[0] & 0xff == 0 {
            Ok(ret[1])
        } else {
            // SAFETY: the host lowered a valid UTF-8 string of ret[2] bytes at ret[1] through
            // our cabi_realloc (the arena); we copy it out before the arena is reset.
            let s = unsafe { std::slice::from_raw_parts(ret[1] as usize as *const u8, ret[2] as usize) };
            Err(String::from_utf8_lossy(s).into_owned())
        }
    }

    pub(crate) fn counter_add(id: u32, delta: u64) {
        // SAFETY: plain integer arguments.
        unsafe { host_counter_add(id as i32, delta as i64) }
    }

    pub(crate) fn now_ns() -> u64 {
        // SAFETY: no arguments.
        unsafe { host_now_ns() as u64 }
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod backend {
    use super::Level;
    use std::cell::RefCell;
    use std::time::Instant;

    /// The per-thread stand-in for the switch, used by tests and native runs.
    pub(crate) struct NativeHost {
        pub logs: Vec<(Level, String)>,
        pub names: Vec<String>,
        pub values: Vec<u64>,
        pub clock: Option<u64>,
        pub start: Instant,
    }

    thread_local! {
        pub(crate) static NATIVE: RefCell<NativeHost> = RefCell::new(NativeHost {
            logs: Vec::new(),
            names: Vec::new(),
            values: Vec::new(),
            clock: None,
            start: Instant::now(),
        });
    }

    pub(crate) fn log(level: Level, message: &str) {
        NATIVE.with(|h| h.borrow_mut().logs.push((level, message.to_owned())));
    }

    pub(crate) fn register_counter(name: &str) -> Result<u32, String> {
        crate::host::check_counter_name(name)?;
        NATIVE.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.names.iter().position(|n| n == name) {
                return Ok(i as u32);
            }
            if h.names.len() >= super::MAX_COUNTERS {
                return Err(format!("too many counters (at most {})", super::MAX_COUNTERS));
            }
            h.names.push(name.to_owned());
            h.values.push(0);
            Ok(h.names.len() as u32 - 1)
        })
    }

    pub(crate) fn counter_add(id: u32, delta: u64) {
        NATIVE.with(|h| {
            if let Some(v) = h.borrow_mut().values.get_mut(id as usize) {
                *v = v.wrapping_add(delta);
            }
        });
    }

    pub(crate) fn now_ns() -> u64 {
        NATIVE.with(|h| {
            let h = h.borrow();
            h.clock.unwrap_or_else(|| h.start.elapsed().as_nanos() as u64)
        })
    }
}

/// The host's rule for counter names, shared so native tests see the same errors.
pub fn check_counter_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!("bad counter name {name:?}: use 1 to 64 characters from [a-z0-9_]"));
    }
    Ok(())
}
