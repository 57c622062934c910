//! One AF_XDP socket: creation, UMEM registration or sharing, ring setup and mapping, bind.
//!
//! Every socket gets its own fill and completion rings (`XDP_UMEM_FILL_RING` /
//! `XDP_UMEM_COMPLETION_RING`), which is what the kernel requires when sockets share a UMEM
//! across different devices or queues (5.10+). The first socket registers the UMEM
//! (`XDP_UMEM_REG`); every later one binds with `XDP_SHARED_UMEM` and that socket's fd, so one
//! UMEM serves every port and forwarding from port A to port B is a descriptor move, not a copy.
//!
//! A shared-UMEM bind cannot choose its own flags: the kernel applies the first socket's copy or
//! zero-copy mode and need_wakeup to all of them (`xp_assign_dev_shared`).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use wasmswitch_core::{Desc, SharedPool, Umem};

use crate::profile::{BindMode, RingSizes};
use crate::ring::{ConsRing, ProdRing, RingPtrs};
use crate::sys::{self, cvt, Mmap};

// The RX and TX rings hold `struct xdp_desc`; the core's `Desc` is declared with the same layout
// so descriptors are copied between the rings and batches without translation.
const _: () = assert!(size_of::<Desc>() == size_of::<libc::xdp_desc>());
const _: () = assert!(std::mem::offset_of!(Desc, len) == std::mem::offset_of!(libc::xdp_desc, len));
const _: () = assert!(std::mem::offset_of!(Desc, options) == std::mem::offset_of!(libc::xdp_desc, options));

/// The socket file descriptor, shared by the RX and TX halves of one queue (and by TX sharers).
///
/// Closing it is what makes the kernel let go of every frame the socket still holds (fill ring
/// entries it took, TX it never completed). Those frames are parked here by `release_all` and
/// go back to the pool when the last half drops this handle, right after the close.
#[derive(Debug)]
pub struct SockHandle {
    fd: Option<OwnedFd>,
    pub(crate) ifname: String,
    pub(crate) queue: u32,
    parked: Mutex<Parked>,
}

#[derive(Debug, Default)]
struct Parked {
    frames: Vec<u64>,
    pool: Option<Arc<SharedPool>>,
}

impl SockHandle {
    /// The socket's descriptor; -1 once it is closed.
    pub fn raw(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Queues frames to be returned to `pool` once the socket is closed.
    pub(crate) fn park(&self, frames: impl IntoIterator<Item = u64>, pool: &Arc<SharedPool>) {
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        p.frames.extend(frames);
        p.pool.get_or_insert_with(|| pool.clone());
    }

    /// True once the kernel has unbound the socket from its device: the device was unregistered
    /// (deleted, or moved to another network namespace, even if it came straight back under
    /// the same name and index). The socket is dead then; only a new one on the device works.
    /// Asked as the datapath's kick asks (a zero-length `sendto`, answered ENXIO), so it may
    /// send what the TX ring holds, as a kick would.
    pub fn unbound(&self) -> bool {
        // SAFETY: zero-length sendto with null buffer and address on our own AF_XDP socket: the
        // kernel reads nothing from userspace memory, it only processes the TX ring.
        let r = unsafe { libc::sendto(self.raw(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
    }

    /// `XDP_STATISTICS` of this socket.
    pub fn statistics(&self) -> io::Result<XdpStatistics> {
        // SAFETY: all-zero is a valid `xdp_statistics` (integers only).
        let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        // SAFETY: `xdp_statistics` is integers only; any bytes the kernel writes are valid.
        unsafe { sys::getsockopt(self.raw(), libc::SOL_XDP, libc::XDP_STATISTICS, &mut s)? };
        Ok(XdpStatistics {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }
}

impl Drop for SockHandle {
    fn drop(&mut self) {
        // Close first: after this the kernel no longer writes into any frame the socket held.
        drop(self.fd.take());
        let p = std::mem::take(self.parked.get_mut().unwrap_or_else(|e| e.into_inner()));
        if let Some(pool) = p.pool {
            let stats = wasmswitch_core::PoolStats::default();
            for chunk in p.frames.chunks(wasmswitch_core::pool::BULK) {
                pool.put_bulk(chunk, &stats);
            }
        }
    }
}

/// The kernel's per-socket counters (`getsockopt(XDP_STATISTICS)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStatistics {
    /// Dropped for reasons other than invalid descriptors (e.g. no fill frame, RX ring full).
    pub rx_dropped: u64,
    /// Received frames dropped for an invalid descriptor (a frame longer than its UMEM chunk, say).
    pub rx_invalid_descs: u64,
    /// Descriptors posted on the TX ring the kernel refused as invalid.
    pub tx_invalid_descs: u64,
    /// Received frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the kernel found the fill ring empty when a frame arrived.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the kernel found the TX ring empty when asked to send.
    pub tx_ring_empty_descs: u64,
}

impl std::ops::Add for XdpStatistics {
    type Output = Self;

    fn add(self, o: Self) -> Self {
        Self {
            rx_dropped: self.rx_dropped + o.rx_dropped,
            rx_invalid_descs: self.rx_invalid_descs + o.rx_invalid_descs,
            tx_invalid_descs: self.tx_invalid_descs + o.tx_invalid_descs,
            rx_ring_full: self.rx_ring_full + o.rx_ring_full,
            rx_fill_ring_empty_descs: self.rx_fill_ring_empty_descs + o.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: self.tx_ring_empty_descs + o.tx_ring_empty_descs,
        }
    }
}

/// Frames of the UMEM held by the kernel on one ring pair, as a bitmap indexed by frame.
///
/// This is the driver's frame accounting: a bit is set when a frame is posted (fill or TX) and
/// cleared when it comes back (RX or completion), so at shutdown every frame still set can be
/// returned, including those the kernel took from the fill ring but never delivered (which no
/// ring shows any more). A set/clear that finds the bit already in that state is a double post
/// or a foreign frame, caught by a debug assertion. An address outside the UMEM is ignored: the
/// bitmap's last word has room for frames the UMEM does not have, and recording one would hand
/// a frame that does not exist back to the pool at shutdown.
#[derive(Debug)]
pub struct FrameSet {
    bits: Vec<u64>,
    count: usize,
    shift: u32,
    frames: usize,
}

impl FrameSet {
    /// An empty set with a bit for each frame of `umem`.
    pub fn new(umem: &Umem) -> Self {
        Self {
            bits: vec![0; (umem.frames() as usize).div_ceil(64)],
            count: 0,
            shift: umem.frame_size().trailing_zeros(),
            frames: umem.frames() as usize,
        }
    }

    /// The frame index of `addr`, or `None` outside the UMEM.
    #[inline]
    fn index(&self, addr: u64) -> Option<usize> {
        // `try_from` cannot fail on a 64-bit target (no check is compiled); on a 32-bit one an
        // index past usize is outside the UMEM too, not wrapped into it.
        usize::try_from(addr >> self.shift).ok().filter(|&i| i < self.frames)
    }

    /// Records that the frame of `addr` went to the kernel (ignored outside the UMEM).
    #[inline]
    pub fn insert(&mut self, addr: u64) {
        let Some(i) = self.index(addr) else { return };
        if let Some(w) = self.bits.get_mut(i / 64) {
            let m = 1u64 << (i % 64);
            debug_assert!(*w & m == 0, "frame {addr:#x} posted twice");
            self.count += (*w & m == 0) as usize;
            *w |= m;
        }
    }

    /// Records that the frame of `addr` came back (ignored outside the UMEM).
    #[inline]
    pub fn remove(&mut self, addr: u64) {
        let Some(i) = self.index(addr) else { return };
        if let Some(w) = self.bits.get_mut(i / 64) {
            let m = 1u64 << (i % 64);
            debug_assert!(*w & m != 0, "frame {addr:#x} came back but was not posted");
            self.count -= (*w & m != 0) as usize;
            *w &= !m;
        }
    }

    /// Frames the kernel holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the kernel holds no frame.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes every frame out of the set, as frame base addresses.
    pub fn drain(&mut self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.count);
        for (wi, w) in self.bits.iter_mut().enumerate() {
            let mut v = std::mem::take(w);
            while v != 0 {
                let b = v.trailing_zeros() as u64;
                out.push(((wi as u64) * 64 + b) << self.shift);
                v &= v - 1;
            }
        }
        self.count = 0;
        out
    }
}

/// The fill and RX rings of a socket (what the polling worker owns).
#[derive(Debug)]
pub struct RxRings {
    /// Free frames handed to the kernel to receive into.
    pub fill: ProdRing<u64>,
    /// Received frames.
    pub rx: ConsRing<Desc>,
    _maps: [Mmap; 2],
}

/// The TX and completion rings of a socket.
#[derive(Debug)]
pub struct TxRings {
    /// Frames to send.
    pub tx: ProdRing<Desc>,
    /// Frames sent, back from the kernel.
    pub comp: ConsRing<u64>,
    _maps: [Mmap; 2],
}

/// A bound socket with its mapped rings, ready to split into halves.
pub struct BoundSocket {
    /// The socket, shared with whatever must close it or read its statistics.
    pub handle: Arc<SockHandle>,
    /// Its fill and RX rings.
    pub rx: RxRings,
    /// Its TX and completion rings.
    pub tx: TxRings,
}

/// Where a step of socket setup failed (so the caller can phrase the error).
#[derive(Debug)]
pub enum SetupError {
    /// `socket(AF_XDP)`.
    Socket(io::Error),
    /// Registering the UMEM (`XDP_UMEM_REG`).
    UmemReg(io::Error),
    /// Sizing the rings, or reading their offsets (`XDP_MMAP_OFFSETS`).
    Rings(io::Error),
    /// Mapping a ring.
    Mmap(io::Error),
    /// `bind` to the interface's queue.
    Bind(io::Error),
}

/// How to bind: register the UMEM here, or share the one registered on `fd`.
#[derive(Clone, Copy, Debug)]
pub enum UmemBinding {
    /// Register the UMEM on this socket, bound in this mode.
    Register(BindMode),
    /// Share the UMEM registered on this socket descriptor.
    Share(RawFd),
}

fn ring_ptrs<T: Copy>(map: &Mmap, off: &libc::xdp_ring_offset, size: u32) -> RingPtrs<T> {
    // SAFETY: the offsets come from XDP_MMAP_OFFSETS for this very ring and the mapping covers
    // `desc + size * size_of::<T>()` bytes (see `map_ring`); the kernel aligns the u32 indices
    // and the descriptor array; the ring views live inside the struct that owns `map`, so the
    // pointers never outlive the mapping; the kernel is the only other party.
    unsafe {
        RingPtrs::new(
            map.at(off.producer).cast::<AtomicU32>(),
            map.at(off.consumer).cast::<AtomicU32>(),
            map.at(off.flags).cast::<AtomicU32>(),
            map.at(off.desc).cast::<T>(),
            size,
        )
    }
}

#[expect(clippy::cast_possible_truncation, reason = "ring offsets lie in the ring's first page")]
fn map_ring<T>(fd: RawFd, off: &libc::xdp_ring_offset, size: u32, pgoff: libc::off_t) -> io::Result<Mmap> {
    Mmap::ring(fd, off.desc as usize + size as usize * size_of::<T>(), pgoff)
}

/// Creates and binds one socket on `(ifindex, queue)`.
pub fn open_socket(
    umem: &Umem,
    ifname: &str,
    ifindex: u32,
    queue: u32,
    rings: RingSizes,
    binding: UmemBinding,
) -> Result<BoundSocket, SetupError> {
    // SAFETY: plain socket creation; the result is checked and owned right after.
    let fd = cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
        .map_err(SetupError::Socket)?;
    // SAFETY: fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();

    if let UmemBinding::Register(_) = binding {
        let reg = libc::xdp_umem_reg {
            addr: umem.as_ptr() as u64,
            len: umem.len() as u64,
            chunk_size: umem.frame_size(),
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg).map_err(SetupError::UmemReg)?;
    }
    // Own fill + completion rings on every socket (required for sharing across devices/queues).
    sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &rings.fill).map_err(SetupError::Rings)?;
    sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_COMPLETION_RING, &rings.completion)
        .map_err(SetupError::Rings)?;
    sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_RX_RING, &rings.rx).map_err(SetupError::Rings)?;
    sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_TX_RING, &rings.tx).map_err(SetupError::Rings)?;

    // SAFETY: all-zero is a valid `xdp_mmap_offsets` (integers only).
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    // SAFETY: integers only, any bytes are valid.
    let got =
        unsafe { sys::getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off) }.map_err(SetupError::Rings)?;
    if got != size_of::<libc::xdp_mmap_offsets>() {
        // Pre-5.4 layout without the flags word: no need_wakeup, which this driver relies on.
        return Err(SetupError::Rings(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel too old: XDP_MMAP_OFFSETS has no ring flags (need 5.4+)",
        )));
    }

    let rx_map = map_ring::<Desc>(raw, &off.rx, rings.rx, libc::XDP_PGOFF_RX_RING).map_err(SetupError::Mmap)?;
    let tx_map = map_ring::<Desc>(raw, &off.tx, rings.tx, libc::XDP_PGOFF_TX_RING).map_err(SetupError::Mmap)?;
    let fill_map = map_ring::<u64>(raw, &off.fr, rings.fill, libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t)
        .map_err(SetupError::Mmap)?;
    let comp_map = map_ring::<u64>(raw, &off.cr, rings.completion, libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t)
        .map_err(SetupError::Mmap)?;

    let (flags, shared_fd) = match binding {
        UmemBinding::Register(BindMode::Copy) => (libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP, 0),
        UmemBinding::Register(BindMode::ZeroCopy) => (libc::XDP_ZEROCOPY | libc::XDP_USE_NEED_WAKEUP, 0),
        // Shared sockets may not pass mode flags; they inherit the UMEM owner's.
        UmemBinding::Share(first) => (libc::XDP_SHARED_UMEM, first as u32),
    };
    #[expect(clippy::cast_possible_truncation, reason = "AF_XDP is 44")]
    let sxdp = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: shared_fd,
    };
    #[expect(clippy::cast_possible_truncation, reason = "a sockaddr_xdp is 16 bytes")]
    let sxdp_len = size_of::<libc::sockaddr_xdp>() as libc::socklen_t;
    // SAFETY: `sxdp` is a valid `sockaddr_xdp` and the length matches it.
    cvt(unsafe { libc::bind(raw, (&sxdp as *const libc::sockaddr_xdp).cast(), sxdp_len) }).map_err(SetupError::Bind)?;

    let rx = RxRings {
        fill: ProdRing::new(ring_ptrs(&fill_map, &off.fr, rings.fill)),
        rx: ConsRing::new(ring_ptrs(&rx_map, &off.rx, rings.rx)),
        _maps: [fill_map, rx_map],
    };
    let tx = TxRings {
        tx: ProdRing::new(ring_ptrs(&tx_map, &off.tx, rings.tx)),
        comp: ConsRing::new(ring_ptrs(&comp_map, &off.cr, rings.completion)),
        _maps: [tx_map, comp_map],
    };
    let handle = Arc::new(SockHandle { fd: Some(fd), ifname: ifname.into(), queue, parked: Mutex::default() });
    Ok(BoundSocket { handle, rx, tx })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_set_tracks_posts_and_returns() {
        let umem = Umem::new(200, 2048).unwrap();
        let mut s = FrameSet::new(&umem);
        s.insert(0);
        s.insert(2048 * 70);
        s.insert(2048 * 199);
        assert_eq!(s.len(), 3);
        s.remove(2048 * 70 + 256); // an RX address inside the frame (after the kernel's headroom)
        assert_eq!(s.len(), 2);
        assert_eq!(s.drain(), vec![0, 2048 * 199]);
        assert!(s.is_empty());
    }

    /// Found by the `umem_desc` fuzz target: with a frame count that is not a multiple of 64, an
    /// address just past the UMEM landed in the bitmap's last word, was counted, and `drain`
    /// returned it as a frame to give back to the pool.
    #[test]
    fn frame_set_ignores_addresses_past_the_umem() {
        let umem = Umem::new(10, 1024).unwrap();
        let mut s = FrameSet::new(&umem);
        s.insert(1024 * 10);
        s.insert(1024 * 63 + 5);
        s.insert(u64::MAX);
        assert!(s.is_empty(), "foreign frames are not recorded");
        s.insert(1024 * 9);
        s.remove(1024 * 10); // a foreign return touches nothing
        assert_eq!(s.len(), 1);
        assert_eq!(s.drain(), vec![1024 * 9]);
    }
}
