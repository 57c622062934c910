//! What connects the two sides: the doorbell that wakes a host worker, the rings of each
//! (datapath worker, host worker) pair with their exit protocol, and the helpers both sides use
//! (steering by flow hash, bulk return to the shared pool).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Mutex;

use wasmswitch_core::pool::{PoolStats, SharedPool};
use wasmswitch_core::Desc;
use wasmswitch_wire::ip::ipv4_field;
use wasmswitch_wire::{ethernet, ethertype};

use crate::error::TapError;
use crate::ring::Spsc;

/// Wakes a sleeping host worker (the `wake_up_process` of cpumap): an eventfd the worker keeps a
/// read posted on, written only when the worker said it is going to sleep.
pub(super) struct Doorbell {
    pub(super) sleeping: AtomicBool,
    pub(super) efd: OwnedFd,
}

impl Doorbell {
    pub(super) fn new() -> Result<Self, TapError> {
        // SAFETY: plain eventfd(2); the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(TapError::io("eventfd", "host worker", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Self { sleeping: AtomicBool::new(false), efd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Called by a producer after publishing into the worker's ring. Returns whether it woke it.
    #[inline]
    pub(super) fn ring(&self) -> bool {
        // Pairs with the fence in the worker's sleep path (Dekker): either the worker sees our
        // ring entries on its re-check, or we see `sleeping` here.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            let _ = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            return true;
        }
        false
    }
}

/// The two rings of one (datapath worker, host worker) pair, and the exit protocol that lets
/// whichever side stops last reclaim every frame left in them.
pub(super) struct Link {
    /// Datapath → host (frames to deliver).
    pub(super) down: Spsc,
    /// Host → datapath (frames the host sent).
    pub(super) up: Spsc,
    dp_done: AtomicBool,
    host_done: AtomicBool,
    /// Taken only by the exit paths, so the final drains never run concurrently.
    reclaim: Mutex<()>,
}

impl Link {
    pub(super) fn new(size: usize) -> Self {
        Self {
            down: Spsc::new(size),
            up: Spsc::new(size),
            dp_done: AtomicBool::new(false),
            host_done: AtomicBool::new(false),
            reclaim: Mutex::new(()),
        }
    }

    /// Called once by each side when it stops producing and consuming: drains the ring it
    /// consumes, and, when the other side has stopped too, the ring it produced into.
    pub(super) fn exit(&self, datapath_side: bool, mut give_back: impl FnMut(&[Desc])) {
        let (mine, other) =
            if datapath_side { (&self.dp_done, &self.host_done) } else { (&self.host_done, &self.dp_done) };
        mine.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let _g = self.reclaim.lock().unwrap_or_else(|e| e.into_inner());
        let (consumed, produced) = if datapath_side { (&self.up, &self.down) } else { (&self.down, &self.up) };
        let mut buf = [Desc::default(); 64];
        let mut drain = |r: &Spsc| loop {
            // SAFETY: under `reclaim`, after this side stopped its hot-path consumption; the
            // ring's other consumer (if this is the produced ring) has set its done flag, i.e.
            // stopped for good, and any later final drain is serialized by the lock.
            let n = unsafe { r.pop_bulk(&mut buf) };
            if n == 0 {
                break;
            }
            give_back(&buf[..n]);
        };
        drain(consumed);
        if other.load(Ordering::SeqCst) {
            drain(produced);
        }
    }
}

/// Spreads frames over host workers by flow: both MAC addresses, and for untagged IPv4 both IP
/// addresses (one 8-byte load, source and destination lie next to each other).
#[inline]
pub(super) fn flow_hash(b: &[u8]) -> u32 {
    const MACS: core::ops::Range<usize> = ethernet::field::DST.start..ethernet::field::SRC.end;
    const IPV4_ADDRS: core::ops::Range<usize> =
        ethernet::HEADER_LEN + ipv4_field::SRC.start..ethernet::HEADER_LEN + ipv4_field::DST.end;
    if b.len() < ethernet::HEADER_LEN {
        return 0;
    }
    let macs = &b[MACS];
    let mut x = u64::from_le_bytes(macs[0..8].try_into().unwrap_or([0; 8]))
        ^ (u32::from_le_bytes(macs[8..12].try_into().unwrap_or([0; 4])) as u64) << 17;
    let ethertype = b.get(ethernet::field::ETHERTYPE).map(|t| u16::from_be_bytes([t[0], t[1]]));
    if let (Some(ethertype::IPV4), Some(addrs)) = (ethertype, b.get(IPV4_ADDRS)) {
        x ^= u64::from_le_bytes(addrs.try_into().unwrap_or([0; 8])).rotate_left(29);
    }
    (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

/// Returns frames to the shared pool from any thread, masked to frame bases, in bulk.
pub(super) fn put_shared(shared: &SharedPool, descs: &[Desc], stats: &PoolStats) {
    let umem = shared.umem();
    let mut buf = [0u64; 64];
    for chunk in descs.chunks(64) {
        for (o, d) in buf.iter_mut().zip(chunk) {
            *o = umem.frame_base(d.addr);
        }
        shared.put_bulk(&buf[..chunk.len()], stats);
    }
}
