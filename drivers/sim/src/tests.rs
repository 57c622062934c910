use std::sync::Arc;

use wasmswitch_core::pool::{check_no_leak, AllocMode, SharedPool};
use wasmswitch_core::wire::{self, MacAddr};

use super::*;

fn setup(frames: u32) -> (Arc<SharedPool>, PoolCache) {
    let umem = Arc::new(Umem::new(frames, 2048).unwrap());
    let pool = SharedPool::new(wasmswitch_core::pool::PoolId(0), umem, 1024);
    let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    (pool, cache)
}

/// TCP with flags over IPv6, spread over VLANs: each source MAC in one VLAN, addressing hosts
/// of the same VLAN, so policies on any of these can be tried end to end in the sim lab.
#[test]
fn tcp_ipv6_and_vlan_traffic_follows_the_spec() {
    use wasmswitch_core::wire::build::{tcp_flags, L4};
    let spec = TrafficSpec {
        port: 1,
        src_macs: 8,
        dst_ports: vec![0],
        broadcast: 0.0,
        vlans: vec![10, 20],
        ipv6: true,
        l4: L4::Tcp(tcp_flags::SYN | tcp_flags::ACK),
        dst_port: 443,
        templates: 64,
        ..Default::default()
    };
    let mut g = TrafficGen::new(&spec);
    for f in g.burst(64).take(64) {
        let m = wire::parse(f, 1518).expect("generator frames are valid");
        assert!(m.has(wire::flags::IPV6) && m.has(wire::flags::CTAG));
        assert_eq!((m.ip_proto, m.ports(f).map(|p| p.1)), (wire::ipproto::TCP, Some(443)));
        assert_eq!(f[m.l4_offset as usize + 13], tcp_flags::SYN | tcp_flags::ACK);
        let lane = |mac: &[u8]| (u32::from_be_bytes([0, mac[3], mac[4], mac[5]]) % 2) as usize;
        assert_eq!(m.vlan, [10, 20][lane(&f[6..12])], "a source MAC speaks in its own VLAN");
        assert_eq!(lane(&f[0..6]), lane(&f[6..12]), "and addresses a host of the same VLAN");
    }
}

#[test]
fn generated_frames_parse_and_follow_the_spec() {
    let spec = TrafficSpec {
        port: 2,
        src_macs: 8,
        dst_ports: vec![0, 1],
        broadcast: 0.25,
        templates: 400,
        ..Default::default()
    };
    let mut g = TrafficGen::new(&spec);
    let mut bcast = 0;
    for f in g.burst(400).take(400) {
        let m = wire::parse(f, 1518).expect("generator frames are valid");
        assert_eq!(m.len, 64);
        let src = MacAddr::from_bytes(&f[6..12]);
        assert_eq!(src.0[2], 2, "source MAC belongs to port 2's range");
        if MacAddr::from_bytes(&f[0..6]) == MacAddr::BROADCAST {
            bcast += 1;
        }
    }
    assert_eq!(bcast, 100, "exactly 25% broadcast over the template table");
}

#[test]
fn rx_needs_fill_frames_and_counts_misses() {
    let (pool, mut cache) = setup(64);
    let spec = TrafficSpec::default();
    let mut q = SimQueue::new(pool.umem().clone(), SimRings { fill: 16, tx: 16 }, Source::Gen(TrafficGen::new(&spec)));
    let mut out = [Desc::default(); 64];
    let n = q.rx_burst(&mut cache, &mut out);
    assert_eq!(n, 16, "only as many packets as fill frames");
    assert_eq!(q.stats().rx_missed.get(), 48);
    // Give the frames back and account for everything.
    let mut bulk = BulkReturn::new();
    for d in &out[..n] {
        bulk.push(&mut cache, d.addr);
    }
    bulk.flush(&mut cache);
    q.release_all(&mut cache);
    let cached = cache.cached().to_vec();
    check_no_leak(&pool, &cached).unwrap();
}

/// Bursts of uneven sizes deliver the generator's frames in order, byte for byte, whatever
/// their length, also when the fill ring's frames wrap around its end and when a burst stops
/// short of the generator's table.
#[test]
fn rx_bursts_deliver_every_generated_frame_in_order() {
    let (pool, mut cache) = setup(64);
    let frames: Vec<Vec<u8>> = [60usize, 64, 65, 68, 80, 81, 200, 1514]
        .iter()
        .enumerate()
        .map(|(k, &len)| (0..len).map(|i| (i * 31 + k * 7).to_le_bytes()[0]).collect())
        .collect();
    let gen = TrafficGen::from_frames(frames.clone());
    let mut q = SimQueue::new(pool.umem().clone(), SimRings { fill: 24, tx: 16 }, Source::Gen(gen));
    let mut out = [Desc::default(); 64];
    let mut next = 0;
    let mut bulk = BulkReturn::new();
    let mut wanted = 0;
    for (round, want) in [5usize, 13, 1, 24, 7, 20, 3, 11].into_iter().cycle().take(40).enumerate() {
        let n = q.rx_burst(&mut cache, &mut out[..want]);
        assert!(n > 0, "round {round}: a stocked fill ring receives");
        wanted += want;
        for d in &out[..n] {
            let want_frame = &frames[next % frames.len()];
            // SAFETY: the frame was just received and is held by this test alone.
            let got = unsafe { pool.umem().bytes(d.addr, d.len as usize) };
            assert_eq!(got, &want_frame[..], "round {round}: frame {next} of the sequence");
            next += 1;
            bulk.push(&mut cache, d.addr);
        }
        bulk.flush(&mut cache);
    }
    assert!(next > 100, "the table was cycled through many times ({next} frames)");
    // A burst larger than the fill ring's stock misses the rest, counted (the ring is refilled
    // a quarter at a time).
    assert_eq!(q.stats().rx_missed.get(), (wanted - next) as u64, "every packet not received is counted");
    q.release_all(&mut cache);
    let cached = cache.cached().to_vec();
    check_no_leak(&pool, &cached).unwrap();
}

#[test]
fn tx_completes_on_doorbell_and_captures() {
    let (pool, mut cache) = setup(64);
    let log = CaptureLog::default();
    let inject = InjectQueue::default();
    inject.lock().unwrap().push_back(vec![7u8; 60]);
    let mut q = SimQueue::new(pool.umem().clone(), SimRings { fill: 32, tx: 4 }, Source::Inject(inject))
        .with_capture(log.clone());
    let mut out = [Desc::default(); 8];
    assert_eq!(q.rx_burst(&mut cache, &mut out), 1);
    assert_eq!(out[0].len, 60);
    let extra: Vec<Desc> = (0..5).map(|_| Desc { addr: cache.alloc().unwrap(), len: 60, options: 0 }).collect();
    assert_eq!(q.tx_burst(&out[..1]), 1);
    assert_eq!(q.tx_burst(&extra), 3, "TX ring of 4 takes 3 more");
    let mut bulk = BulkReturn::new();
    assert_eq!(q.complete(&mut cache, &mut bulk), 0, "nothing completes before the doorbell");
    q.flush_tx();
    assert_eq!(q.complete(&mut cache, &mut bulk), 4);
    bulk.flush(&mut cache);
    assert_eq!(log.lock().unwrap()[0], vec![7u8; 60]);
    assert_eq!(q.stats().wire_tx_packets.get(), 4);
    for d in &extra[3..] {
        cache.put(d.addr);
    }
    q.release_all(&mut cache);
    let cached = cache.cached().to_vec();
    check_no_leak(&pool, &cached).unwrap();
}

#[test]
fn pacer_limits_rate() {
    use std::time::Instant;
    // Judged against the time that passed, measured around each call: a busy machine that
    // preempts the test (or oversleeps) changes how many are due, not whether they are right.
    let spec = TrafficSpec { rate_pps: Some(1000), ..Default::default() };
    let t0 = Instant::now();
    let mut g = TrafficGen::new(&spec);
    let t1 = Instant::now();
    let first = g.budget(64);
    assert!(first as f64 <= t0.elapsed().as_secs_f64() * 1000.0, "{first} due at {:?}", t0.elapsed());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (lo, b, hi) = (t1.elapsed(), g.budget(64), t0.elapsed());
    let total = (first + b) as f64;
    let least = (lo.as_secs_f64() * 1000.0).floor().min((first + 64) as f64);
    assert!(least >= 20.0, "at least 20 ms passed");
    assert!(
        (least..=hi.as_secs_f64() * 1000.0).contains(&total),
        "1 kpps: {total} packets due between {lo:?} and {hi:?} after the start"
    );
}

#[test]
fn the_rate_of_a_running_generator_can_be_changed() {
    let spec = TrafficSpec { rate_pps: Some(1), ..Default::default() };
    let mut g = TrafficGen::new(&spec);
    let rate = g.rate_handle().expect("a paced generator has a rate");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(g.budget(64), 0, "1 pps: nothing due after 100 ms");
    // Without a new schedule, 1 kpps over the 100 ms already gone would be 100 packets due.
    rate.store(1000, std::sync::atomic::Ordering::Relaxed);
    assert!(g.budget(64) <= 1, "a new rate starts a new schedule, without a catch-up burst");
    rate.store(1_000_000, std::sync::atomic::Ordering::Relaxed);
    g.budget(64);
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(g.budget(64), 64, "1 Mpps: 5000 due after 5 ms, capped at the burst");
    assert!(TrafficGen::new(&TrafficSpec::default()).rate_handle().is_none(), "unlimited has no rate");
}
