//! Frame memory: one region of fixed-size frames (an AF_XDP UMEM).
//!
//! A frame is named by its byte offset in the region (`addr`), exactly as the kernel's AF_XDP
//! rings name it, so descriptors move between the pool, the pipeline and the kernel untranslated.
//! Ownership of a frame travels with its address: whoever holds the address may touch the bytes.
//! That discipline is what the `unsafe` accessors below rely on.

use std::io;
use std::ptr::NonNull;

/// Bytes every driver leaves free before packet data in a frame: the kernel's
/// `XDP_PACKET_HEADROOM`, which AF_XDP leaves on receive, so a frame read by any port (sim, TAP)
/// looks the same to the pipeline and later stages can push headers in place.
pub const HEADROOM: u32 = 256;

/// A page-aligned, pre-faulted region of `frames * frame_size` bytes.
#[derive(Debug)]
pub struct Umem {
    base: NonNull<u8>,
    len: usize,
    frame_size: u32,
    frame_shift: u32,
    frames: u32,
}

// SAFETY: the region is plain memory; concurrent access to one frame is excluded by the ownership
// discipline documented on `bytes`/`bytes_mut` (a frame address has exactly one holder).
unsafe impl Send for Umem {}
// SAFETY: as above; shared references only hand out frame slices under that discipline.
unsafe impl Sync for Umem {}

impl Umem {
    /// Maps `frames` frames of `frame_size` bytes (a power of two, 2048 or 4096 for AF_XDP).
    pub fn new(frames: u32, frame_size: u32) -> io::Result<Self> {
        if !frame_size.is_power_of_two() || !(512..=65536).contains(&frame_size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("frame size {frame_size} must be a power of two between 512 and 65536"),
            ));
        }
        if frames == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a UMEM needs at least one frame"));
        }
        let len = frames as usize * frame_size as usize;
        // SAFETY: anonymous private mapping with no address hint; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            base: NonNull::new(ptr.cast()).expect("mmap returned a null mapping"),
            len,
            frame_size,
            frame_shift: frame_size.trailing_zeros(),
            frames,
        })
    }

    /// The region's first byte (frame address 0).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The region's length in bytes: `frames * frame_size`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never: [`Umem::new`] refuses zero frames).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes per frame: a power of two, 512 to 65536.
    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// Frames in the region (at least one).
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// The base address of the frame that contains `addr`.
    #[inline]
    pub fn frame_base(&self, addr: u64) -> u64 {
        addr & !(self.frame_size as u64 - 1)
    }

    /// How far `addr` lies into its frame (a packet's headroom, when `addr` is its start).
    #[inline]
    pub fn frame_offset(&self, addr: u64) -> u64 {
        addr & (self.frame_size as u64 - 1)
    }

    /// The index of the frame that contains `addr`.
    #[inline]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "an address in the region is in one of `frames` (a u32) frames"
    )]
    pub fn frame_index(&self, addr: u64) -> u32 {
        (addr >> self.frame_shift) as u32
    }

    /// Starts loading the cache line at `addr` (a packet's first bytes), as NIC drivers prefetch
    /// the data of the descriptors they will parse next.
    #[inline]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a hint: a wrong address on a 32-bit target prefetches a wrong line, no more"
    )]
    pub fn prefetch(&self, addr: u64) {
        // Address arithmetic, not an index: a prefetch reads nothing, so it needs no bounds check.
        let at = self.base.as_ptr().wrapping_add(addr as usize);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetch is a hint with no memory effects and cannot fault, whatever the address.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at;
    }

    /// True when `[addr, addr + len)` lies inside one frame of this region.
    #[inline]
    pub fn in_bounds(&self, addr: u64, len: usize) -> bool {
        // The region is whole frames, so a range that starts inside it and does not run past
        // the end of its own frame lies inside it (an empty range may also sit at the very end).
        // Checked per frame read on the datapath: no wide arithmetic.
        #[expect(clippy::cast_possible_truncation, reason = "below the frame size, at most 65536")]
        let off = self.frame_offset(addr) as usize;
        let starts_inside = addr < self.len as u64 || (len == 0 && addr == self.len as u64);
        starts_inside && len <= self.frame_size as usize - off
    }

    /// The bytes `[addr, addr + len)`, or an empty slice when that range is not inside one frame
    /// (a corrupt descriptor then reads as a runt and is dropped, never as a wild read).
    ///
    /// # Safety
    /// The caller holds the frame (its address came from the pool, an RX ring or a completion it
    /// owns) and nobody writes it for the lifetime of the slice.
    #[inline]
    pub unsafe fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        if !self.in_bounds(addr, len) {
            return &[];
        }
        #[expect(clippy::cast_possible_truncation, reason = "in bounds: `addr` is at most `len`, a usize")]
        // SAFETY: in bounds (checked above), so the offset stays inside the mapping.
        let start = unsafe { self.base.as_ptr().add(addr as usize) };
        // SAFETY: `len` bytes from `start` are mapped (in bounds); exclusive holding of the frame
        // is the caller's contract.
        unsafe { std::slice::from_raw_parts(start, len) }
    }

    /// Mutable bytes `[addr, addr + len)`, empty when out of range.
    ///
    /// # Safety
    /// The caller holds the frame exclusively for the lifetime of the slice.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, addr: u64, len: usize) -> &mut [u8] {
        if !self.in_bounds(addr, len) {
            return &mut [];
        }
        #[expect(clippy::cast_possible_truncation, reason = "in bounds: `addr` is at most `len`, a usize")]
        // SAFETY: in bounds (checked above), so the offset stays inside the mapping.
        let start = unsafe { self.base.as_ptr().add(addr as usize) };
        // SAFETY: `len` bytes from `start` are mapped (in bounds); exclusive holding of the frame
        // is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(start, len) }
    }
}

/// Copies one packet's bytes: `dst` and `src` have one length (else this panics, as
/// `copy_from_slice` does). A frame of 32 to 80 bytes (an Ethernet frame is at least 60; a tag or
/// two and a TCP ACK stay under 80) is a head and a tail copy of fixed sizes, a few vector moves
/// inline, where a `memcpy` call costs more than the copy; longer frames take `memcpy`.
#[inline]
pub fn copy_packet(dst: &mut [u8], src: &[u8]) {
    #[inline(always)]
    fn head_and_tail<const HEAD: usize, const TAIL: usize>(dst: &mut [u8], src: &[u8]) {
        // Both are long enough (the match below), so neither `if` can fail.
        if let (Some(d), Some(s)) = (dst.first_chunk_mut::<HEAD>(), src.first_chunk::<HEAD>()) {
            *d = *s;
        }
        if let (Some(d), Some(s)) = (dst.last_chunk_mut::<TAIL>(), src.last_chunk::<TAIL>()) {
            *d = *s;
        }
    }
    match src.len() {
        n if n != dst.len() => dst.copy_from_slice(src),
        32..=64 => head_and_tail::<32, 32>(dst, src),
        65..=80 => head_and_tail::<64, 16>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_geometry() {
        assert!(Umem::new(16, 1000).is_err());
        assert!(Umem::new(0, 2048).is_err());
    }

    #[test]
    fn bounds_are_checked_per_frame() {
        let u = Umem::new(4, 2048).unwrap();
        assert!(u.in_bounds(0, 2048));
        assert!(!u.in_bounds(100, 2048), "a range may not straddle two frames");
        assert!(!u.in_bounds(3 * 2048, 4096));
        // SAFETY: the single-threaded test owns every frame.
        unsafe { u.bytes_mut(2048 + 10, 4) }.copy_from_slice(&[1, 2, 3, 4]);
        // SAFETY: as above; nothing writes while these slices live.
        assert_eq!(unsafe { u.bytes(2048 + 10, 4) }, &[1, 2, 3, 4]);
        // SAFETY: as above (out of bounds reads as empty).
        assert!(unsafe { u.bytes(8191, 2) }.is_empty());
        assert_eq!(u.frame_base(2048 + 300), 2048);
        assert_eq!(u.frame_index(3 * 2048 + 5), 3);
    }

    #[test]
    fn prefetch_is_a_hint_at_any_address() {
        let u = Umem::new(4, 2048).unwrap();
        // Stale descriptors past a batch's end are prefetched too: no address may fault.
        for addr in [0, 2048 + 256, u.len() as u64, u64::MAX, 1 << 63] {
            u.prefetch(addr);
        }
        // SAFETY: the single-threaded test owns every frame.
        unsafe { u.bytes_mut(256, 2) }.copy_from_slice(&[7, 9]);
        // SAFETY: as above.
        assert_eq!(unsafe { u.bytes(256, 2) }, &[7, 9], "a prefetch changes nothing");
    }

    #[test]
    fn copy_packet_copies_every_length_exactly() {
        let src: Vec<u8> = (0..=255u8).map(|i| i.wrapping_mul(7).wrapping_add(1)).collect();
        for len in 0..=256 {
            let mut dst = vec![0xee; len + 1];
            copy_packet(&mut dst[..len], &src[..len]);
            assert_eq!(&dst[..len], &src[..len], "length {len}");
            assert_eq!(dst[len], 0xee, "length {len}: wrote past the end");
        }
    }

    #[test]
    #[should_panic]
    fn copy_packet_refuses_a_length_mismatch() {
        copy_packet(&mut [0; 64], &[1; 65]);
    }
}
