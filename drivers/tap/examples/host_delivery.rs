//! Host delivery benchmark: 64-byte frames into a TAP whose frames the stack drops.
//!
//! `cargo run --release -p wasmswitch-tap --example host_delivery -- [--packets N] [--rounds R] [--cpu C] [--len L]`
//!
//! Modes, interleaved round by round (median reported): one `write()` per packet, then the
//! host worker's list delivery (`HostRing::deliver`: N write SQEs, one `io_uring_enter`) at
//! bulk 8, 32, 64, each with the options added step by step: plain ring → registered file →
//! fixed buffers (UMEM registered) → single issuer + defer taskrun. Then, at bulk 32 on top
//! of all of those, what else io_uring offers (`Extra`): CQEs skipped on success, the list as
//! one hard-linked chain, SQPOLL, io-wq (IOSQE_ASYNC). Then the "floor": zero-length writes,
//! which tun refuses at once, i.e. the cost of getting one request to the driver. Then the
//! full path (datapath thread → `HostPortQueue` → ring → host worker thread) at bulk 8, 32.
//!
//! The frames are IPv4/UDP to a MAC that is not the TAP's: the stack drops them as
//! PACKET_OTHERHOST right after `eth_type_trans`. Mpps from wall time; ns/packet from the
//! process's CPU time (user + sys, all threads). Needs root.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmswitch_core::pool::AllocMode;
use wasmswitch_core::{BulkReturn, Desc, PoolCache, PortQueue, SharedPool, Umem};
use wasmswitch_tap::{HostConfig, HostPort, HostRing, TapConfig, TapDevice, UringOptions};

fn cpu_ns() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; all-zero is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes a bit inside our live set (cpu < 1024).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: reads our live set for the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

fn frame(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0x02, 0xee, 0, 0, 0, 9]); // not the TAP's MAC
    f[6..12].copy_from_slice(&[0x02, 0xee, 0, 0, 0, 8]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&(1000 + (i % 64) as u16).to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    let mut sum = 0u32;
    for c in f[14..34].chunks(2) {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f
}

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    /// Zero-length writes: the tun driver refuses them at once, so this measures the cost of
    /// getting a request to the driver (syscall or SQE) without the stack's work.
    floor: bool,
    bulk: usize, // 0 = write() per packet
    opts: UringOptions,
    /// Beyond `HostRing::deliver`: io_uring features measured here only (see `Extra`).
    extra: Option<Extra>,
}

/// io_uring features tried in this benchmark on top of all of `UringOptions` (registered file,
/// fixed buffers over the UMEM, single issuer, deferred task work), with a ring of their own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    /// The same as `HostRing::deliver` with every option, written out here: the control.
    Control,
    /// `IOSQE_CQE_SKIP_SUCCESS` on every write and a trailing NOP whose CQE ends the list: one
    /// CQE per list. Not safe for the switch (a write that went async would complete
    /// silently after the NOP); measured as the upper bound of what skipping CQEs gives.
    SkipCqe,
    /// The writes hard-linked into one chain, CQEs skipped but for the last: one CQE per list
    /// and safe (a link starts only after the previous write completed).
    LinkedChain,
    /// `IORING_SETUP_SQPOLL`: a kernel thread (pinned to the other CPU) submits; the worker
    /// only fills the SQ and reaps CQEs. CPU time includes that thread.
    SqPoll,
    /// `IOSQE_ASYNC`: every write goes to io-wq worker threads.
    Async,
}

fn extra_ring(x: Extra, fd: i32, umem: &Umem, cpu: Option<usize>) -> io_uring::IoUring {
    let mut b = io_uring::IoUring::builder();
    if x == Extra::SqPoll {
        b.setup_sqpoll(1000);
        if let Some(c) = cpu {
            b.setup_sqpoll_cpu((c ^ 1) as u32);
        }
    } else {
        b.setup_single_issuer().setup_defer_taskrun();
    }
    let ring = b.build(256).expect("io_uring setup");
    ring.submitter().register_files(&[fd]).expect("register_files");
    let iov = libc::iovec { iov_base: umem.as_ptr().cast(), iov_len: umem.len() };
    // SAFETY: the iovec covers the UMEM, which outlives the ring (dropped at the end of run_mode).
    unsafe { ring.submitter().register_buffers(&[iov]) }.expect("register_buffers");
    ring
}

/// One list through `ring` the way `x` says; returns when every write of it has completed.
fn extra_deliver(x: Extra, ring: &mut io_uring::IoUring, umem: &Umem, descs: &[Desc]) -> u64 {
    use io_uring::{opcode, squeue::Flags, types};
    let base = umem.as_ptr();
    let n = descs.len();
    {
        let mut sq = ring.submission();
        for (i, d) in descs.iter().enumerate() {
            let mut e = opcode::WriteFixed::new(types::Fixed(0), base.wrapping_add(d.addr as usize), d.len, 0)
                .build()
                .user_data(i as u64);
            e = match x {
                Extra::SkipCqe => e.flags(Flags::SKIP_SUCCESS),
                Extra::LinkedChain if i + 1 < n => e.flags(Flags::IO_HARDLINK | Flags::SKIP_SUCCESS),
                Extra::Async => e.flags(Flags::ASYNC),
                _ => e,
            };
            // SAFETY: the frames stay untouched until the list's completions are reaped below.
            unsafe { sq.push(&e) }.expect("SQ has room for a list");
        }
        if x == Extra::SkipCqe {
            // SAFETY: a NOP names no buffer.
            unsafe { sq.push(&opcode::Nop::new().build().user_data(u64::MAX)) }.expect("SQ has room");
        }
    }
    // CQEs this list posts on success: one per write, or one for the whole list.
    let mut want = match x {
        Extra::SkipCqe | Extra::LinkedChain => 1,
        _ => n,
    };
    let mut errors = 0;
    while want > 0 {
        ring.submit_and_wait(1).expect("io_uring_enter");
        for c in ring.completion() {
            if c.result() < 0 {
                errors += 1;
                // A failed write posts its CQE even when skipped-on-success.
                if matches!(x, Extra::SkipCqe | Extra::LinkedChain) {
                    continue;
                }
            }
            want -= 1;
        }
    }
    errors
}

struct Sample {
    mpps: f64,
    ns_pkt: f64,
}

fn run_mode(m: &Mode, fd: i32, umem: &Arc<Umem>, descs: &[Desc], packets: u64, cpu: Option<usize>) -> Sample {
    let zero: Vec<Desc>;
    let descs = if m.floor {
        zero = descs.iter().map(|d| Desc { len: 0, ..*d }).collect();
        &zero[..]
    } else {
        descs
    };
    let c0 = cpu_ns();
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut errors = 0u64;
    if let Some(x) = m.extra {
        let mut ring = extra_ring(x, fd, umem, cpu);
        let chunks: Vec<&[Desc]> = descs.chunks(m.bulk).collect();
        'outer3: loop {
            for c in &chunks {
                errors += extra_deliver(x, &mut ring, umem, c);
                sent += c.len() as u64;
                if sent >= packets {
                    break 'outer3;
                }
            }
        }
    } else if m.bulk == 0 {
        let base = umem.as_ptr();
        'outer: loop {
            for d in descs {
                let p = base.wrapping_add(d.addr as usize);
                // SAFETY: writes bytes of a frame of our UMEM, which nothing else touches.
                let r = unsafe { libc::write(fd, p.cast(), d.len as usize) };
                if r < 0 {
                    errors += 1;
                }
                sent += 1;
                if sent >= packets {
                    break 'outer;
                }
            }
        }
    } else {
        let mut ring = HostRing::new(fd, umem.clone(), &m.opts).expect("io_uring");
        let chunks: Vec<&[Desc]> = descs.chunks(m.bulk).collect();
        'outer2: loop {
            for c in &chunks {
                let d = ring.deliver(c, |_, _| {});
                errors += d.errors;
                sent += c.len() as u64;
                if sent >= packets {
                    break 'outer2;
                }
            }
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ns() - c0) as f64;
    if errors > 0 && !m.floor {
        eprintln!("{}: {errors} write errors", m.name);
    }
    Sample { mpps: sent as f64 / wall / 1e6, ns_pkt: cpu / sent as f64 }
}

/// The full path: this thread as the datapath worker, one host worker thread.
fn run_e2e(tap_name: &str, len: usize, bulk: usize, dur: Duration, cpu: Option<usize>) -> (f64, f64, f64, f64) {
    let pool = SharedPool::new(wasmswitch_core::pool::PoolId(0), Arc::new(Umem::new(8192, 2048).unwrap()), 4096);
    let tap =
        TapDevice::create(&TapConfig { name: tap_name.into(), mac: [2, 0, 0, 0, 0, 1], mtu: 1500, queues: 1 }).unwrap();
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{tap_name}/disable_ipv6"), "1");
    let cfg = HostConfig { bulk, ring_size: 1024, ..HostConfig::default() };
    // The host worker inherits this thread's affinity: give it the other CPU, then come back.
    if let Some(c) = cpu {
        pin(c ^ 1);
    }
    let (mut host, mut qs) = HostPort::start(tap, &pool, &cfg).unwrap();
    let mut q = qs.remove(0);
    if let Some(c) = cpu {
        pin(c);
    }
    let mut cache = PoolCache::new(pool.clone(), 256, AllocMode::Recycling);
    let umem = pool.umem().clone();
    let f = frame(0, len);
    let stop = AtomicBool::new(false);
    let c0 = cpu_ns();
    let t0 = Instant::now();
    let mut burst = [Desc::default(); 64];
    while !stop.load(Ordering::Relaxed) {
        // Offered load just under what the host worker takes (closed loop on ring occupancy),
        // so this measures delivery, not a drop storm (see the flood test for that).
        if host.frames_in_rings() > 1024 - 128 {
            std::hint::spin_loop();
            if t0.elapsed() >= dur {
                stop.store(true, Ordering::Relaxed);
            }
            continue;
        }
        let mut n = 0;
        for d in burst.iter_mut() {
            let Some(a) = cache.alloc() else { break };
            // SAFETY: frame just allocated to this thread.
            unsafe { umem.bytes_mut(a, len) }.copy_from_slice(&f);
            *d = Desc { addr: a, len: len as u32, options: 0 };
            n += 1;
        }
        q.tx_burst(&burst[..n]);
        q.flush_tx();
        let mut b = BulkReturn::new();
        q.complete(&mut cache, &mut b);
        b.flush(&mut cache);
        if n == 0 {
            std::thread::yield_now();
        }
        if t0.elapsed() >= dur {
            stop.store(true, Ordering::Relaxed);
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let t_before_stop = host.stats().totals();
    let cpu = (cpu_ns() - c0) as f64;
    q.release_all(&mut cache);
    drop(q);
    host.stop();
    let delivered = t_before_stop.delivered as f64;
    let drop_pct = 100.0 * t_before_stop.ring_full as f64 / t_before_stop.enqueued.max(1) as f64;
    let avg_batch = delivered / t_before_stop.batch_hist.iter().sum::<u64>().max(1) as f64;
    (delivered / wall / 1e6, cpu / delivered.max(1.0), drop_pct, avg_batch)
}

fn main() {
    let mut packets: u64 = 1_000_000;
    let mut rounds = 3;
    let mut cpu: Option<usize> = None;
    let mut len = 64usize;
    let mut e2e = true;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = || args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--packets" => packets = v().parse().expect("--packets N"),
            "--rounds" => rounds = v().parse().expect("--rounds R"),
            "--cpu" => cpu = Some(v().parse().expect("--cpu C")),
            "--len" => len = v().parse().expect("--len L"),
            "--no-e2e" => {
                e2e = false;
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("host_delivery needs root (creates a TAP)");
        std::process::exit(2);
    }
    if let Some(c) = cpu {
        pin(c);
    }
    let name = format!("wsbench{}", std::process::id() % 100_000);
    let tap = TapDevice::create(&TapConfig { name: name.clone(), mac: [2, 0, 0, 0, 0, 1], mtu: 1500, queues: 1 })
        .expect("create TAP");
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    tap.set_up(true).unwrap();
    let fd = tap.queue_fd(0).unwrap();
    let umem = Arc::new(Umem::new(4096, 2048).unwrap());
    // 4096 frames, each holding one packet at offset 256 (where the host worker reads to).
    let descs: Vec<Desc> = (0..4096u32)
        .map(|i| {
            let a = i as u64 * 2048 + 256;
            let f = frame(i, len);
            // SAFETY: single-threaded setup owns the whole UMEM.
            unsafe { umem.bytes_mut(a, len) }.copy_from_slice(&f);
            Desc { addr: a, len: len as u32, options: 0 }
        })
        .collect();

    let plain = UringOptions::plain();
    let regfile = UringOptions { registered_file: true, ..plain };
    let fixed = UringOptions { fixed_buffers: true, ..regfile };
    let all = UringOptions::default();
    let mut modes = vec![Mode { name: "write() per packet", bulk: 0, opts: plain, floor: false, extra: None }];
    for bulk in [8, 32, 64] {
        for (n, o) in [("plain", plain), ("+regfile", regfile), ("+fixedbuf", fixed), ("+single+defer", all)] {
            modes.push(Mode {
                name: Box::leak(format!("uring bulk {bulk:>2} {n}").into_boxed_str()),
                bulk,
                opts: o,
                floor: false,
                extra: None,
            });
        }
    }
    for (n, x) in [
        ("control", Extra::Control),
        ("+skip-cqe+nop", Extra::SkipCqe),
        ("+hardlink chain", Extra::LinkedChain),
        ("sqpoll", Extra::SqPoll),
        ("+async (io-wq)", Extra::Async),
    ] {
        modes.push(Mode {
            name: Box::leak(format!("uring bulk 32 {n}").into_boxed_str()),
            bulk: 32,
            opts: all,
            floor: false,
            extra: Some(x),
        });
    }
    modes.push(Mode { name: "floor: write() of 0 bytes", bulk: 0, opts: plain, floor: true, extra: None });
    modes.push(Mode { name: "floor: uring bulk 32, 0 bytes", bulk: 32, opts: all, floor: true, extra: None });
    {
        let r = HostRing::new(fd, umem.clone(), &all).unwrap();
        println!("kernel granted with all options: {:?}", r.features());
    }
    println!("TAP {name}, {len}-byte frames, {packets} packets per sample, {rounds} rounds interleaved, cpu {cpu:?}");
    // Warm up.
    run_mode(&modes[0], fd.as_raw_fd(), &umem, &descs, packets / 4, cpu);
    let mut samples: Vec<Vec<Sample>> = modes.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (k, m) in modes.iter().enumerate() {
            samples[k].push(run_mode(m, fd, &umem, &descs, packets, cpu));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let mut base_mpps = 0.0;
    let mut base_ns = 0.0;
    println!(
        "{:<32} {:>8} {:>8} {:>10} {:>12} {:>14}",
        "mode", "Mpps", "min-max", "ns/pkt", "x write Mpps", "x write ns/pkt"
    );
    for (k, m) in modes.iter().enumerate() {
        let mut mp: Vec<f64> = samples[k].iter().map(|s| s.mpps).collect();
        let mut ns: Vec<f64> = samples[k].iter().map(|s| s.ns_pkt).collect();
        let (lo, hi) = (mp.iter().cloned().fold(f64::MAX, f64::min), mp.iter().cloned().fold(0.0, f64::max));
        let (mpm, nsm) = (median(&mut mp), median(&mut ns));
        if k == 0 {
            base_mpps = mpm;
            base_ns = nsm;
        }
        println!(
            "{:<32} {:>8.3} {:>8} {:>10.0} {:>12.2} {:>14.2}",
            m.name,
            mpm,
            format!("{lo:.2}-{hi:.2}"),
            nsm,
            mpm / base_mpps,
            base_ns / nsm
        );
    }
    drop(tap);
    if e2e {
        println!("full path (datapath thread -> HostPortQueue -> ring 1024 -> host worker thread, all options), 2 s each, offered load paced by ring occupancy, datapath on --cpu, host worker on the other:");
        println!("{:<32} {:>8} {:>10} {:>8} {:>10}", "mode", "Mpps", "ns/pkt", "drop %", "avg list");
        for bulk in [8, 32] {
            let (mpps, ns, drop_pct, avg) = run_e2e(
                &format!("wsbe{}b{bulk}", std::process::id() % 100_000),
                len,
                bulk,
                Duration::from_secs(2),
                cpu,
            );
            println!("{:<32} {:>8.3} {:>10.0} {:>8.1} {:>10.1}", format!("e2e bulk {bulk}"), mpps, ns, drop_pct, avg);
        }
    }
}
