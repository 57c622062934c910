//! Cost of completing offloaded checksums on ingress, per packet.
//!
//!     cargo run --release -p wasmswitch-core --example checksum_bench [-- --rounds N]
//!
//! For TCP/IPv4 frames of 64, 512 and 1514 bytes: `complete_partial` on a frame whose checksum
//! is complete (the recognition only: a pseudo-header sum and a compare, what every TCP/UDP
//! frame on a veth port pays) and on a frame whose sender left it to offload (the sum over the
//! segment and the store). Each measurement is the best of `--rounds` passes (default 5) over
//! a batch of 64 frames repeated; prints ns/packet.

use std::hint::black_box;
use std::time::Instant;

use wasmswitch_core::wire::build::tcp4_frame;
use wasmswitch_core::wire::checksum::{complete_partial, Completion};
use wasmswitch_core::wire::{parse, MacAddr, PacketMeta};

const BATCH: usize = 64;
const PASSES: usize = 20_000;

/// A TCP/IPv4 frame of `len` bytes with a complete checksum.
fn frame(len: usize) -> Vec<u8> {
    let mut f =
        tcp4_frame(MacAddr([2, 0, 0, 0, 0, 2]), MacAddr([2, 0, 0, 0, 0, 1]), [10, 0, 0, 1], [10, 0, 0, 2], 1, 2);
    f.truncate(54);
    f.resize(len, 0xa5);
    let total = (len - 14) as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let c = wasmswitch_core::wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let m = parse(&f, 9000).unwrap();
    wasmswitch_core::wire::checksum::fill_l4_checksum(&mut f, &m);
    f
}

/// Best ns/packet over `rounds` passes; `partial` (when given) is written back into the checksum
/// field before each call, so every call completes a partial frame.
fn measure(frames: &mut [Vec<u8>], meta: &PacketMeta, partial: Option<&[u8; 2]>, rounds: usize) -> f64 {
    let field = meta.l4_offset as usize + 16;
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..PASSES {
            for f in frames.iter_mut() {
                if let Some(p) = partial {
                    f[field..field + 2].copy_from_slice(p);
                }
                black_box(complete_partial(black_box(f), meta));
            }
        }
        best = best.min(t.elapsed().as_nanos() as f64 / (PASSES * frames.len()) as f64);
    }
    best
}

fn main() {
    let mut rounds = 5;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        rounds = args.get(i + 1).and_then(|v| v.parse().ok()).filter(|&r| r > 0).expect("--rounds N (N >= 1)");
    }
    println!("| frame bytes | complete frame (recognition only) ns/pkt | partial frame (completed) ns/pkt |");
    println!("|---|---|---|");
    for len in [64, 512, 1514] {
        let f = frame(len);
        let meta = parse(&f, 9000).unwrap();
        let field = meta.l4_offset as usize + 16;
        // The sender's partial form; completing it must give back the full frame.
        let mut partial = f.clone();
        let pseudo = partial_field(&f, &meta);
        partial[field..field + 2].copy_from_slice(&pseudo);
        let mut check = partial.clone();
        assert_eq!(complete_partial(&mut check, &meta), Completion::Completed);
        assert_eq!(check, f, "completion restores the full checksum");
        let mut complete: Vec<Vec<u8>> = (0..BATCH).map(|_| f.clone()).collect();
        let mut partials: Vec<Vec<u8>> = (0..BATCH).map(|_| partial.clone()).collect();
        let a = measure(&mut complete, &meta, None, rounds);
        let b = measure(&mut partials, &meta, Some(&pseudo), rounds);
        println!("| {len} | {a:.1} | {b:.1} |");
    }
}

/// The checksum field a sender with TX offload writes: the folded pseudo-header sum, i.e. the
/// complement of the checksum over the pseudo-header alone.
fn partial_field(f: &[u8], m: &PacketMeta) -> [u8; 2] {
    let l3 = m.l3_offset as usize;
    let l4_len = u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]) as usize - (m.l4_offset as usize - l3);
    let mut p = Vec::with_capacity(12);
    p.extend_from_slice(&f[l3 + 12..l3 + 20]);
    p.extend_from_slice(&[0, m.ip_proto]);
    p.extend_from_slice(&(l4_len as u16).to_be_bytes());
    (!wasmswitch_core::wire::checksum::checksum(&p)).to_be_bytes()
}
