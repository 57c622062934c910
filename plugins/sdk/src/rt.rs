//! The glue behind [`crate::export_plugin!`]: the canonical-ABI exports, written by hand.
//!
//! Why by hand and not with `wit-bindgen`: the batch call is the hot path, and its cost is the
//! host's call overhead plus whatever the guest does per call. `wit-bindgen` would hand the
//! plugin an owned `Vec<u8>` for the `list<u8>` argument (a `malloc` on every batch through
//! `cabi_realloc`, a `free` in post-return) and allocate a fresh `Vec` for the result. Here
//! `cabi_realloc` bumps into one arena that is reused for every call (it only grows, and only
//! between calls), the verdicts are written into one buffer that lives as long as the
//! instance, and there is no post-return function at all. The signatures are the ones the
//! canonical ABI gives the world's functions; `wit-component` checks them against
//! `wit/plugin.wit` when it wraps the module into a component, and the host checks the
//! component's types again when it loads it.

use crate::abi;
use crate::plugin::Plugin;
use crate::view::{Batch, BatchError, Verdicts};

/// Runs `plugin` over one encoded batch, writing the result into `out` (cleared first):
/// `4 * count` verdict bytes, then the batch's counter deltas (see `abi::split_result`). This
/// is exactly what the Wasm export does, minus the ABI; the host's native comparison stage and
/// the test harness call it directly.
pub fn run_batch<P: Plugin>(plugin: &mut P, batch: &[u8], out: &mut Vec<u8>) -> Result<(), BatchError> {
    let batch = Batch::new(batch)?;
    out.clear();
    out.resize(batch.len() * abi::VERDICT_LEN, 0);
    plugin.process(&batch, &mut Verdicts::new(out));
    crate::host::append_counter_deltas(out);
    Ok(())
}

/// The log line of a panic: `plugin panicked at src/lib.rs:3:5: message`, on one line (the
/// hook's `PanicHookInfo` displays as two, which a line-based log splits from its context).
pub fn panic_line(location: Option<&std::panic::Location<'_>>, message: Option<&str>) -> String {
    let at = location.map_or_else(|| "an unknown location".to_string(), |l| l.to_string());
    let message = message.unwrap_or("(a panic payload that is not a string)").replace(['\n', '\r'], "\\n");
    format!("plugin panicked at {at}: {message}")
}

#[cfg(target_arch = "wasm32")]
pub use wasm::*;

#[cfg(target_arch = "wasm32")]
mod wasm {
    use super::*;
    use std::alloc::Layout;
    use std::cell::UnsafeCell;

    /// A cell for single-threaded Wasm statics.
    pub struct Slot<T>(UnsafeCell<T>);

    // SAFETY: wasm32-unknown-unknown guests have one thread, and the host never re-enters an
    // instance (one call at a time per Store; the world's exports are not reentrant).
    unsafe impl<T> Sync for Slot<T> {}

    impl<T> Slot<T> {
        pub const fn new(v: T) -> Self {
            Slot(UnsafeCell::new(v))
        }

        /// # Safety
        /// No other reference from `get` is live (true for single-threaded, non-reentrant use
        /// where each export takes it once).
        #[allow(clippy::mut_from_ref)]
        pub unsafe fn get(&self) -> &mut T {
            // SAFETY: the caller guarantees exclusivity.
            unsafe { &mut *self.0.get() }
        }
    }

    /// The bump arena `cabi_realloc` serves the host from. Storage is `u64` so any alignment
    /// up to 8 holds at offset 0.
    struct Arena {
        words: Vec<u64>,
        used: usize,
        /// Allocations that did not fit (several arguments in one call); freed at reset.
        spill: Vec<(*mut u8, Layout)>,
    }

    static ARENA: Slot<Arena> = Slot::new(Arena { words: Vec::new(), used: 0, spill: Vec::new() });
    static VERDICTS: Slot<Vec<u8>> = Slot::new(Vec::new());
    /// Return area: `result<_, string>` is (disc, ptr, len); `list<u8>` is (ptr, len).
    static RET: Slot<[u32; 3]> = Slot::new([0; 3]);
    static INIT_ERROR: Slot<String> = Slot::new(String::new());

    /// `cabi_realloc`: the host calls it to place arguments (the config string, the batch) and
    /// import results (an error string) in our memory.
    ///
    /// # Safety
    /// Called by the canonical ABI only: `old` is null or a pointer this function returned
    /// with `old_len` bytes; `align` is a power of two.
    pub unsafe fn realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
        // SAFETY: single-threaded, not reentrant (see Slot).
        let a = unsafe { ARENA.get() };
        let cap = a.words.len() * 8;
        if a.used == 0 && new_len > cap {
            // Grow only while nothing in the arena is live: the first allocation of a call.
            let words = new_len.next_power_of_two().max(4096) / 8;
            a.words = vec![0u64; words];
        }
        let cap = a.words.len() * 8;
        let start = (a.used + align - 1) & !(align - 1);
        let p = if align <= 8 && start + new_len <= cap {
            a.used = start + new_len;
            // SAFETY: start + new_len <= cap, inside the arena's allocation.
            unsafe { (a.words.as_mut_ptr() as *mut u8).add(start) }
        } else {
            let layout = Layout::from_size_align(new_len.max(1), align).unwrap_or_else(|_| std::process::abort());
            // SAFETY: layout has a non-zero size.
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            a.spill.push((p, layout));
            p
        };
        if !old.is_null() {
            // SAFETY: `old` holds `old_len` bytes (contract) and `p` holds `new_len`; distinct.
            unsafe { std::ptr::copy_nonoverlapping(old, p, old_len.min(new_len)) };
        }
        p
    }

    fn reset_arena() {
        // SAFETY: single-threaded, not reentrant; nothing borrows the arena after a call.
        let a = unsafe { ARENA.get() };
        a.used = 0;
        for (p, layout) in a.spill.drain(..) {
            // SAFETY: allocated above with this layout and not freed since.
            unsafe { std::alloc::dealloc(p, layout) };
        }
    }

    fn install_panic_hook() {
        static DONE: Slot<bool> = Slot::new(false);
        // SAFETY: single-threaded.
        let done = unsafe { DONE.get() };
        if !*done {
            *done = true;
            // Panics abort (an `unreachable` trap); say why first, through the host's log.
            std::panic::set_hook(Box::new(|info| {
                crate::host::log(crate::host::Level::Error, &super::panic_line(info.location(), info.payload_as_str()));
            }));
        }
    }

    /// The `init` export.
    ///
    /// # Safety
    /// Called by the canonical ABI with a UTF-8 string the host placed with `cabi_realloc`.
    pub unsafe fn init<P: Plugin>(slot: &Slot<Option<P>>, ptr: *const u8, len: usize) -> *mut u8 {
        install_panic_hook();
        // SAFETY: (ptr, len) is the lowered string argument, valid until we return.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        let result = match std::str::from_utf8(bytes) {
            Ok(config) => P::init(config),
            Err(e) => Err(format!("config is not UTF-8: {e}")),
        };
        crate::host::flush_counters();
        reset_arena();
        // SAFETY: single-threaded, not reentrant.
        let (ret, err, slot) = unsafe { (RET.get(), INIT_ERROR.get(), slot.get()) };
        match result {
            Ok(p) => {
                *slot = Some(p);
                ret[0] = 0;
            }
            Err(e) => {
                *slot = None;
                *err = e;
                *ret = [1, err.as_ptr() as u32, err.len() as u32];
            }
        }
        ret.as_mut_ptr() as *mut u8
    }

    /// The `process` export.
    ///
    /// # Safety
    /// Called by the canonical ABI with the batch bytes the host placed with `cabi_realloc`.
    pub unsafe fn process<P: Plugin>(slot: &Slot<Option<P>>, ptr: *const u8, len: usize) -> *mut u8 {
        // SAFETY: (ptr, len) is the lowered list argument, valid until we return.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        // SAFETY: single-threaded, not reentrant.
        let (ret, out, slot) = unsafe { (RET.get(), VERDICTS.get(), slot.get()) };
        let Some(plugin) = slot.as_mut() else { panic!("process called before a successful init") };
        if let Err(e) = run_batch(plugin, bytes, out) {
            panic!("malformed batch from the host: {e:?}");
        }
        reset_arena();
        ret[0] = out.as_ptr() as u32;
        ret[1] = out.len() as u32;
        ret.as_mut_ptr() as *mut u8
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_is_one_line_with_its_location() {
        let at = std::panic::Location::caller();
        let line = super::panic_line(Some(at), Some("bad frame\nsecond line"));
        assert_eq!(
            line,
            format!("plugin panicked at {}:{}:{}: bad frame\\nsecond line", at.file(), at.line(), at.column())
        );
        assert_eq!(
            super::panic_line(None, None),
            "plugin panicked at an unknown location: (a panic payload that is not a string)"
        );
    }
}
