// The `umem_desc` fuzz target's body, shared verbatim (via `include!`) by the libFuzzer target
// and by `drivers/afxdp/tests/fuzz_corpus.rs`, which replays the committed corpus on stable.
//
// Descriptors that come back from the kernel (RX, completions) carry an addr/len the switch did
// not choose. Two places judge them: `Umem::in_bounds` / `Umem::bytes` (core) before any byte is
// read, and the driver's `FrameSet` (which frames the kernel holds) on every post and return.
// Both are checked against a reference model for arbitrary addresses, in and out of the UMEM.
//
// Input: byte 0 picks the frame size (512..=4096), byte 1 the frame count (1..=200, mostly not a
// multiple of 64), then 11-byte ops: kind, addr (u64 LE), len (u16 LE).

use std::collections::BTreeSet;

use wasmswitch_afxdp::xsk::FrameSet;
use wasmswitch_core::Umem;

pub fn check(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let frame_size = 512u32 << (data[0] % 4);
    let frames = 1 + data[1] as u32 % 200;
    let umem = Umem::new(frames, frame_size).expect("a small anonymous mapping");
    let total = frames as u64 * frame_size as u64;
    let mut set = FrameSet::new(&umem);
    let mut model = BTreeSet::new();

    for op in data[2..].chunks_exact(11) {
        let raw = u64::from_le_bytes(op[1..9].try_into().unwrap());
        // Half the ops aim inside (or just past) the UMEM, half anywhere in the u64 range.
        let addr = if op[0] & 0x80 != 0 { raw } else { raw % (total + 2 * frame_size as u64) };
        let len = u16::from_le_bytes([op[9], op[10]]) as usize;
        match op[0] % 3 {
            0 => {
                let fs = frame_size as u64;
                let end = addr as u128 + len as u128;
                let want = end <= total as u128 && (len == 0 || addr / fs == (end as u64 - 1) / fs);
                assert_eq!(umem.in_bounds(addr, len), want, "in_bounds({addr:#x}, {len}) in {frames} x {fs}");
                // SAFETY: one thread, nothing else holds or writes any frame of this UMEM.
                let b = unsafe { umem.bytes(addr, len) };
                assert_eq!(b.len(), if want { len } else { 0 });
                // Touch the bytes: a wild slice would fault here.
                std::hint::black_box(b.iter().fold(0u8, |a, x| a ^ x));
            }
            // Post a frame (fill/TX): the driver only posts frames it holds, never twice.
            1 => {
                let f = addr / frame_size as u64;
                if f < frames as u64 && model.insert(f) {
                    set.insert(addr);
                } else if f >= frames as u64 {
                    set.insert(addr); // a foreign address must be ignored, not recorded
                }
            }
            // A frame comes back (RX/completion), possibly a foreign address.
            _ => {
                let f = addr / frame_size as u64;
                if f >= frames as u64 || model.remove(&f) {
                    set.remove(addr);
                }
            }
        }
        assert_eq!(set.len(), model.len(), "FrameSet count");
    }
    let drained = set.drain();
    let want: Vec<u64> = model.iter().map(|f| f * frame_size as u64).collect();
    assert_eq!(drained, want, "drain returns exactly the posted frames, as frame bases inside the UMEM");
    assert!(set.is_empty());
}
