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
/// Offsets in `struct xdp_md`.
const XDP_MD_DATA: i16 = 0;
const XDP_MD_DATA_END: i16 = 4;
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;

/// Encodes one `struct bpf_insn` (code, dst/src registers, offset, immediate) as a little-endian u64.
pub const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    (code as u64)
        | (((dst & 0xf) | ((src & 0xf) << 4)) as u64) << 8
        | ((off as u16) as u64) << 16
        | ((imm as u32) as u64) << 32
}

/// The opcodes the programs here use (`include/uapi/linux/bpf_common.h` and `bpf.h`).
pub mod op {
    /// `BPF_LDX | BPF_MEM | BPF_W`: load a 32-bit word from memory into `dst`.
    pub const LDX_W: u8 = 0x61;
    /// `BPF_LDX | BPF_MEM | BPF_H`: load a 16-bit half word.
    pub const LDX_H: u8 = 0x69;
    /// `BPF_LDX | BPF_MEM | BPF_DW`: load a 64-bit double word.
    pub const LDX_DW: u8 = 0x79;
    /// `BPF_STX | BPF_MEM | BPF_W`: store `src`'s low 32 bits to memory.
    pub const STX_W: u8 = 0x63;
    /// `BPF_STX | BPF_MEM | BPF_H`: store `src`'s low 16 bits.
    pub const STX_H: u8 = 0x6b;
    /// `BPF_STX | BPF_MEM | BPF_DW`: store all 64 bits of `src`.
    pub const STX_DW: u8 = 0x7b;
    /// `BPF_ST | BPF_MEM | BPF_DW`: store the immediate, sign-extended to 64 bits.
    pub const ST_DW: u8 = 0x7a;
    /// `BPF_LD | BPF_IMM | BPF_DW`: load a 64-bit immediate (two instruction slots).
    pub const LD_IMM64: u8 = 0x18;
    /// `BPF_ALU64 | BPF_MOV | BPF_K`: `dst = imm`.
    pub const MOV64_K: u8 = 0xb7;
    /// `BPF_ALU64 | BPF_MOV | BPF_X`: `dst = src`.
    pub const MOV64_X: u8 = 0xbf;
    /// `BPF_ALU64 | BPF_ADD | BPF_K`: `dst += imm`.
    pub const ADD64_K: u8 = 0x07;
    /// `BPF_ALU | BPF_END | BPF_TO_BE`: byte-swap `dst` to big endian (width in `imm`).
    pub const TO_BE: u8 = 0xdc;
    /// `BPF_JMP | BPF_JNE | BPF_K`: jump by `off` when `dst != imm`.
    pub const JNE_K: u8 = 0x55;
    /// `BPF_JMP | BPF_JGT | BPF_X`: jump by `off` when `dst > src` (unsigned).
    pub const JGT_X: u8 = 0x2d;
    /// `BPF_JMP | BPF_CALL`: call helper or kfunc `imm`.
    pub const CALL: u8 = 0x85;
    /// `BPF_JMP | BPF_EXIT`: return `r0`.
    pub const EXIT: u8 = 0x95;
}

/// The redirect program for an XSKMAP whose fd is `map_fd`.
pub fn redirect_program(map_fd: RawFd) -> [u64; 6] {
    use op::*;
    [
        insn(LDX_W, 2, 1, XDP_MD_RX_QUEUE_INDEX, 0),
        insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0), // second half of the 16-byte ld_imm64 (upper 32 bits of the fd: 0)
        insn(MOV64_K, 3, 0, 0, XDP_PASS),
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// The redirect program, preceded by putting back an 802.1Q/802.1ad tag that the kernel holds
/// outside the frame: a sender's tx-vlan offload (a VLAN device or a bridge on the other end of
/// a veth) or a NIC's rx-vlan stripping leaves the tag in metadata, where XDP does not see it,
/// and the switch would take the frame for untagged. The kfunc `bpf_xdp_metadata_rx_vlan_tag`
/// (`vlan_kfunc`: its BTF id; Linux 6.8+, device-bound programs in native mode) reads it; the
/// program grows the head by 4 bytes, moves the MACs and writes the tag where it was sent.
/// Without a tag, or without room, the frame goes on as it came.
///
/// ```text
///  0  r6 = r1                         ; ctx, kept across calls
///  1  *(u64 *)(r10 - 8) = 0           ; proto (be16) at fp-8, tci at fp-6
///  2  r2 = r10 ; r2 += -8
///  4  r3 = r10 ; r3 += -6
///  6  call bpf_xdp_metadata_rx_vlan_tag(ctx, &proto, &tci)
///  7  if r0 != 0 goto redirect        ; no tag held outside (or no driver support)
///  8  r1 = r6 ; r2 = -4
/// 10  call bpf_xdp_adjust_head        ; helper 44
/// 11  if r0 != 0 goto redirect        ; no headroom: as it came
/// 12  r2 = ctx->data ; r3 = ctx->data_end ; r4 = r2 + 18
/// 16  if r4 > r3 goto redirect
/// 17  MACs 4 bytes forward: u64 [4..12] -> [0..8], u32 [12..16] -> [8..12]
/// 21  [12..14] = proto ; [14..16] = htons(tci)
/// 26  redirect: r1 = r6, then the five instructions of `redirect_program`
/// ```
pub fn vlan_restoring_program(map_fd: RawFd, vlan_kfunc: u32) -> Vec<u64> {
    use op::*;
    const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
    const BPF_FUNC_XDP_ADJUST_HEAD: i32 = 44;
    const REDIRECT: i16 = 26;
    // A jump at `pc` to `REDIRECT` (offsets count from the next instruction).
    let to_redirect = |pc: i16| REDIRECT - pc - 1;
    let mut p = vec![
        insn(MOV64_X, 6, 1, 0, 0),
        insn(ST_DW, 10, 0, -8, 0),
        insn(MOV64_X, 2, 10, 0, 0),
        insn(ADD64_K, 2, 0, 0, -8),
        insn(MOV64_X, 3, 10, 0, 0),
        insn(ADD64_K, 3, 0, 0, -6),
        insn(CALL, 0, BPF_PSEUDO_KFUNC_CALL, 0, vlan_kfunc as i32),
        insn(JNE_K, 0, 0, to_redirect(7), 0),
        insn(MOV64_X, 1, 6, 0, 0),
        insn(MOV64_K, 2, 0, 0, -4),
        insn(CALL, 0, 0, 0, BPF_FUNC_XDP_ADJUST_HEAD),
        insn(JNE_K, 0, 0, to_redirect(11), 0),
        insn(LDX_W, 2, 6, XDP_MD_DATA, 0),
        insn(LDX_W, 3, 6, XDP_MD_DATA_END, 0),
        insn(MOV64_X, 4, 2, 0, 0),
        insn(ADD64_K, 4, 0, 0, 18),
        insn(JGT_X, 4, 3, to_redirect(16), 0),
        insn(LDX_DW, 4, 2, 4, 0),
        insn(STX_DW, 2, 4, 0, 0),
        insn(LDX_W, 4, 2, 12, 0),
        insn(STX_W, 2, 4, 8, 0),
        insn(LDX_H, 4, 10, -8, 0),
        insn(STX_H, 2, 4, 12, 0),
        insn(LDX_H, 4, 10, -6, 0),
        insn(TO_BE, 4, 0, 0, 16),
        insn(STX_H, 2, 4, 14, 0),
    ];
    debug_assert_eq!(p.len(), REDIRECT as usize);
    // The calls clobbered r1: the redirect reads the queue index through it.
    p.push(insn(MOV64_X, 1, 6, 0, 0));
    p.extend(redirect_program(map_fd));
    p
}

/// An XSKMAP (queue id → AF_XDP socket).
#[derive(Debug)]
pub struct XskMap {
    fd: OwnedFd,
    entries: u32,
}

impl XskMap {
    /// Creates a map with `entries` slots (at least one), one per queue id.
    pub fn new(entries: u32) -> io::Result<Self> {
        Ok(Self { fd: sys::xskmap_create(entries.max(1))?, entries: entries.max(1) })
    }

    /// Its slots: queue ids `0..entries` can be pointed at a socket.
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
        sys::prog_load_xdp(&insns, "wsx_redirect", None).map(|fd| Self { fd })
    }

    /// Loads [`vlan_restoring_program`] for `map`, bound to interface `ifindex` (the VLAN kfunc
    /// is the driver's, so the program is device-bound: native mode on that interface only).
    /// `None` when the running kernel has no such kfunc.
    pub fn load_vlan_restoring(map: &XskMap, ifindex: u32) -> Option<Result<Self, (io::Error, String)>> {
        let kfunc = crate::btf::vmlinux_func_id("bpf_xdp_metadata_rx_vlan_tag")?;
        let insns = vlan_restoring_program(map.as_raw_fd(), kfunc);
        Some(sys::prog_load_xdp(&insns, "wsx_redirect_vl", Some(ifindex)).map(|fd| Self { fd }))
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
    /// Attaches `prog` to interface `ifindex` in `mode_flags`' mode (`XDP_FLAGS_*`).
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

    #[test]
    fn the_vlan_restoring_program_jumps_to_its_redirect() {
        let p = vlan_restoring_program(7, 66089);
        // The kfunc call: src_reg BPF_PSEUDO_KFUNC_CALL, imm the BTF id.
        assert_eq!(p[6].to_le_bytes(), [0x85, 0x20, 0, 0, 0x29, 0x02, 0x01, 0]);
        // Every conditional jump lands on `r1 = r6`, right before the plain redirect program.
        let redirect = p.len() - 6 - 1;
        assert_eq!(p[redirect].to_le_bytes(), [0xbf, 0x61, 0, 0, 0, 0, 0, 0]);
        assert_eq!(p[redirect + 1..], redirect_program(7));
        for (pc, i) in p.iter().enumerate() {
            let b = i.to_le_bytes();
            let code = b[0];
            if code & 0x07 == 0x05 && code != 0x85 && code != 0x95 {
                let off = i16::from_le_bytes([b[2], b[3]]);
                assert_eq!(pc as i64 + 1 + off as i64, redirect as i64, "jump at {pc}");
            }
        }
    }
}
