//! The XDP side: an XSKMAP, the redirect program, and its bpf_link attachment.
//!
//! The program is five instructions (six slots), assembled by hand so the crate needs no C
//! toolchain, no libbpf and no object file:
//!
//! ```text
//! r2 = *(u32 *)(r1 + 16)          ; ctx->rx_queue_index
//! r1 = map_fd <xskmap> ll         ; BPF_LD_IMM64, src_reg = BPF_PSEUDO_MAP_FD
//! r3 = XDP_PASS                   ; flags: action when the slot is empty
//! call bpf_redirect_map           ; helper 51
//! exit                            ; r0 = XDP_REDIRECT, or XDP_PASS
//! ```
//!
//! A queue without a socket (or a socket not yet inserted) therefore passes its traffic to the
//! kernel stack unchanged, which is what makes attaching before the sockets are ready harmless.
//!
//! The attachment is a bpf_link (`BPF_LINK_CREATE`, attach type `BPF_XDP`): the kernel detaches
//! the program when the last reference to the link fd goes away, including when the process is
//! killed with SIGKILL, so a crashed switch never leaves a stale redirect behind.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys;

/// `XDP_FLAGS_SKB_MODE` (generic XDP).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE` (native XDP in the driver).
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

const XDP_PASS: i32 = 2;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// Offset of `rx_queue_index` in `struct xdp_md`.
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;

/// Encodes one `struct bpf_insn` (code, dst/src registers, offset, immediate) as a little-endian u64.
const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    (code as u64)
        | (((dst & 0xf) | ((src & 0xf) << 4)) as u64) << 8
        | ((off as u16) as u64) << 16
        | ((imm as u32) as u64) << 32
}

/// The redirect program for an XSKMAP whose fd is `map_fd`.
pub fn redirect_program(map_fd: RawFd) -> [u64; 6] {
    const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
    const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_IMM | BPF_DW
    const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
    const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
    [
        insn(LDX_MEM_W, 2, 1, XDP_MD_RX_QUEUE_INDEX, 0),
        insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0), // second half of the 16-byte ld_imm64 (upper 32 bits of the fd: 0)
        insn(MOV64_K, 3, 0, 0, XDP_PASS),
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// An XSKMAP (queue id → AF_XDP socket).
#[derive(Debug)]
pub struct XskMap {
    fd: OwnedFd,
    entries: u32,
}

impl XskMap {
    pub fn new(entries: u32) -> io::Result<Self> {
        Ok(Self { fd: sys::xskmap_create(entries.max(1))?, entries: entries.max(1) })
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Points `queue`'s slot at the socket `xsk_fd`.
    pub fn insert(&self, queue: u32, xsk_fd: RawFd) -> io::Result<()> {
        sys::map_update_u32(self.fd.as_raw_fd(), queue, xsk_fd as u32)
    }

    /// Empties `queue`'s slot (its traffic then goes to the kernel stack).
    pub fn remove(&self, queue: u32) -> io::Result<()> {
        sys::map_delete_u32(self.fd.as_raw_fd(), queue)
    }
}

impl AsRawFd for XskMap {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A loaded redirect program.
#[derive(Debug)]
pub struct XdpProgram {
    fd: OwnedFd,
}

impl XdpProgram {
    /// Loads the redirect program for `map`. The error carries the verifier log, if any.
    pub fn load(map: &XskMap) -> Result<Self, (io::Error, String)> {
        let insns = redirect_program(map.as_raw_fd());
        sys::prog_load_xdp(&insns, "wsx_redirect").map(|fd| Self { fd })
    }
}

impl AsRawFd for XdpProgram {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A bpf_link holding the program on an interface; dropping it detaches.
#[derive(Debug)]
pub struct XdpLink {
    _fd: OwnedFd,
}

impl XdpLink {
    pub fn attach(prog: &XdpProgram, ifindex: u32, mode_flags: u32) -> io::Result<Self> {
        Ok(Self { _fd: sys::xdp_link_create(prog.as_raw_fd(), ifindex, mode_flags)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_encoding_matches_the_bpf_isa() {
        let p = redirect_program(7);
        // r2 = *(u32 *)(r1 + 16): code 0x61, dst 2, src 1, off 16
        assert_eq!(p[0].to_le_bytes(), [0x61, 0x12, 16, 0, 0, 0, 0, 0]);
        // ld_imm64 r1, map fd 7 (src = BPF_PSEUDO_MAP_FD), then the zero second slot
        assert_eq!(p[1].to_le_bytes(), [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(p[2], 0);
        // r3 = 2 (XDP_PASS)
        assert_eq!(p[3].to_le_bytes(), [0xb7, 0x03, 0, 0, 2, 0, 0, 0]);
        // call 51 (bpf_redirect_map)
        assert_eq!(p[4].to_le_bytes(), [0x85, 0, 0, 0, 51, 0, 0, 0]);
        assert_eq!(p[5].to_le_bytes(), [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }
}
