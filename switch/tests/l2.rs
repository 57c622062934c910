//! L2 behaviour, frame accounting and malformed input, on the sim driver (no root needed).

use std::sync::Arc;

use wasmswitch_core::fdb::Fdb;
use wasmswitch_core::pipeline::{Pipeline, PipelineOptions, PortSlot};
use wasmswitch_core::pool::{check_no_leak, AllocMode, PoolCache, SharedPool};
use wasmswitch_core::stats::{DropReason, WorkerStats};
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_core::wire::build::{insert_vlan, udp4_frame};
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::{PortId, Umem};
use wasmswitch_sim::{CaptureLog, InjectQueue, SimQueue, SimRings, Source, TrafficGen};

struct Rig {
    pool: Arc<SharedPool>,
    fdb: Arc<Fdb>,
    pipe: Pipeline,
    inject: Vec<InjectQueue>,
    capture: Vec<CaptureLog>,
}

fn mac(i: u8) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, i])
}

fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    udp4_frame(dst, src, [10, 0, 0, src.0[5]], [10, 0, 0, dst.0[5]], 1000, 2000, 64)
}

/// `ports` sim ports fed by injection queues, capturing what they transmit.
fn rig(ports: usize, frames: u32, aging: u32) -> Rig {
    let umem = Arc::new(Umem::new(frames, 2048).unwrap());
    let pool = SharedPool::new(0, umem.clone(), 256);
    let fdb = Arc::new(Fdb::new(1024, aging));
    let mut inject = Vec::new();
    let mut capture = Vec::new();
    let slots = (0..ports)
        .map(|_| {
            let i = InjectQueue::default();
            let c = CaptureLog::default();
            inject.push(i.clone());
            capture.push(c.clone());
            let q = SimQueue::new(umem.clone(), SimRings { fill: 64, tx: 256 }, Source::Inject(i)).with_capture(c);
            PortSlot {
                queues: vec![Box::new(q)],
                max_frame: 1522,
                ingress: None,
                up: true,
                queue_index: 0,
                complete_partial_checksums: false,
            }
        })
        .collect();
    let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let stats = Arc::new(WorkerStats::new(0, ports, cache.stats().clone()));
    let pipe = Pipeline::new(slots, cache, fdb.clone(), stats, PipelineOptions::default());
    Rig { pool, fdb, pipe, inject, capture }
}

impl Rig {
    fn send(&mut self, port: usize, f: Vec<u8>) {
        self.inject[port].lock().unwrap().push_back(f);
        while self.pipe.poll() > 0 {}
    }

    /// Frames each port transmitted since the last call.
    fn take(&mut self) -> Vec<Vec<Vec<u8>>> {
        self.capture.iter().map(|c| std::mem::take(&mut *c.lock().unwrap())).collect()
    }

    fn finish(mut self) {
        self.pipe.shutdown();
        drop(self.pipe);
        check_no_leak(&self.pool, &[]).unwrap();
    }
}

#[test]
fn unknown_unicast_floods_learned_unicast_goes_to_one_port_only() {
    let mut r = rig(3, 1024, 300);
    let f = frame(mac(2), mac(1));
    r.send(0, f.clone());
    let out = r.take();
    assert_eq!(out[0].len(), 0, "never back out of the ingress port");
    assert_eq!(out[1], vec![f.clone()], "unknown unicast is flooded");
    assert_eq!(out[2], vec![f.clone()], "to every other port");
    assert_eq!(r.fdb.lookup(mac(1)), Some(0), "source learned on its ingress port");

    let reply = frame(mac(1), mac(2));
    r.send(1, reply.clone());
    let out = r.take();
    assert_eq!(out[0], vec![reply], "known unicast goes to the learned port");
    assert!(out[1].is_empty() && out[2].is_empty(), "and nowhere else");
    assert_eq!(r.fdb.lookup(mac(2)), Some(1));

    let again = frame(mac(2), mac(1));
    r.send(0, again.clone());
    let out = r.take();
    assert_eq!(out[1], vec![again]);
    assert!(out[0].is_empty() && out[2].is_empty());
    r.finish();
}

#[test]
fn broadcast_and_vlan_frames_flood_to_all_other_ports() {
    let mut r = rig(4, 1024, 300);
    let mut b = frame(MacAddr::BROADCAST, mac(9));
    insert_vlan(&mut b, 100);
    r.send(2, b.clone());
    let out = r.take();
    for (p, frames) in out.iter().enumerate() {
        if p == 2 {
            assert!(frames.is_empty(), "no hairpin");
        } else {
            assert_eq!(frames, &vec![b.clone()], "port {p} gets the broadcast");
        }
    }
    assert_eq!(r.pipe.stats().flood_copies.get(), 2, "one copy per extra port");
    r.finish();
}

#[test]
fn destination_on_the_ingress_port_is_filtered() {
    let mut r = rig(2, 512, 300);
    r.send(0, frame(MacAddr::BROADCAST, mac(1)));
    r.send(0, frame(MacAddr::BROADCAST, mac(2)));
    r.take();
    r.send(0, frame(mac(2), mac(1)));
    let out = r.take();
    assert!(out.iter().all(Vec::is_empty), "both hosts are behind port 0");
    assert_eq!(r.pipe.stats().ports[0].drops[DropReason::Hairpin as usize].get(), 1);
    r.finish();
}

#[test]
fn moved_mac_is_relearned_and_aging_forgets() {
    let mut r = rig(3, 512, 10);
    r.send(0, frame(MacAddr::BROADCAST, mac(1)));
    assert_eq!(r.fdb.lookup(mac(1)), Some(0));
    r.send(2, frame(MacAddr::BROADCAST, mac(1)));
    assert_eq!(r.fdb.lookup(mac(1)), Some(2), "station moved");
    assert_eq!(r.pipe.stats().fdb_moved.get(), 1);
    r.take();
    r.fdb.age(11);
    assert_eq!(r.fdb.lookup(mac(1)), None, "aged out after 10 silent ticks");
    r.send(1, frame(mac(1), mac(3)));
    let out = r.take();
    assert_eq!(out[0].len() + out[2].len(), 2, "forgotten destination floods again");
    r.finish();
}

/// Random verdicts, including invalid redirects and host without a host port.
struct RandomVerdicts(fastrand::Rng, u16);

impl VerdictStage for RandomVerdicts {
    fn run(&mut self, _b: &BatchView<'_>, verdicts: &mut [Verdict]) {
        for v in verdicts {
            *v = match self.0.u8(0..6) {
                0 => Verdict::Drop,
                1 => Verdict::Redirect(self.0.u16(0..self.1 + 2) as PortId),
                2 => Verdict::Host,
                3 => Verdict::HostCopy,
                _ => Verdict::Pass,
            };
        }
    }
}

#[test]
fn millions_of_random_frames_leak_nothing() {
    // A small pool so exhaustion, ring-full and release paths are all exercised.
    let umem = Arc::new(Umem::new(2048, 2048).unwrap());
    let pool = SharedPool::new(0, umem.clone(), 64);
    let fdb = Arc::new(Fdb::new(256, 5));
    let nports = 4u16;
    let mut gen_frames = Vec::new();
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..512u32 {
        let dst = if i % 7 == 0 { MacAddr::BROADCAST } else { MacAddr([2, 0, 0, 0, 1, rng.u8(0..40)]) };
        let mut f = udp4_frame(
            dst,
            MacAddr([2, 0, 0, 0, 1, rng.u8(0..40)]),
            [1, 1, 1, 1],
            [2, 2, 2, 2],
            1,
            2,
            rng.usize(60..300),
        );
        match i % 11 {
            0 => f.truncate(rng.usize(0..14)),                              // runt
            1 => f.truncate(20),                                            // truncated IPv4
            2 => f = (0..rng.usize(14..200)).map(|_| rng.u8(..)).collect(), // random bytes
            3 => f.resize(1600, 0),                                         // oversize
            _ => {}
        }
        gen_frames.push(f);
    }
    let slots = (0..nports)
        .map(|p| {
            let mut frames = gen_frames.clone();
            frames.rotate_left(p as usize * 37);
            let q = SimQueue::new(
                umem.clone(),
                SimRings { fill: 128, tx: 96 },
                Source::Gen(TrafficGen::from_frames(frames)),
            );
            PortSlot {
                queues: vec![Box::new(q)],
                max_frame: 1522,
                ingress: Some(
                    Box::new(RandomVerdicts(fastrand::Rng::with_seed(p as u64), nports)) as Box<dyn VerdictStage>
                ),
                up: true,
                queue_index: 0,
                complete_partial_checksums: false,
            }
        })
        .collect();
    let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let stats = Arc::new(WorkerStats::new(0, nports as usize, cache.stats().clone()));
    let opts = PipelineOptions { host_port: Some(3), ..Default::default() };
    let mut pipe = Pipeline::new(slots, cache, fdb.clone(), stats.clone(), opts);
    let mut received = 0;
    let mut round = 0u32;
    while received < 2_000_000 {
        received += pipe.poll();
        round += 1;
        if round.is_multiple_of(1000) {
            fdb.age(round / 1000);
            pipe.set_now(round / 1000);
            // Ports going down and up again mid-traffic.
            pipe.set_port_up(1, !round.is_multiple_of(3000));
        }
    }
    pipe.shutdown();
    drop(pipe);
    check_no_leak(&pool, &[]).expect("every frame is back exactly once");
    let drops: u64 = stats.ports.iter().map(|p| p.drops_total()).sum();
    for r in [DropReason::Runt, DropReason::BadL3, DropReason::Oversize, DropReason::Policy, DropReason::BadRedirect] {
        let n: u64 = stats.ports.iter().map(|p| p.drops[r as usize].get()).sum();
        assert!(n > 0, "{r:?} drops were counted");
    }
    assert!(drops < received as u64);
    assert!(stats.pool.alloc_fast.get() > 0);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Arbitrary bytes (runts, truncated headers, oversize) never panic, and every frame is
    /// either transmitted or counted as a drop with a reason; none is lost.
    #[test]
    fn arbitrary_frames_are_forwarded_or_counted(frames in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..1700), 1..40)) {
        let mut r = rig(2, 512, 300);
        let n = frames.len() as u64;
        for f in frames {
            r.inject[0].lock().unwrap().push_back(f);
        }
        while r.pipe.poll() > 0 {}
        let st = &r.pipe.stats().ports[0];
        let sent = r.capture[1].lock().unwrap().len() as u64;
        proptest::prop_assert_eq!(st.rx_packets.get(), n);
        // A flood to one other port makes no copies, so each frame went out once or was dropped.
        proptest::prop_assert_eq!(sent + st.drops_total(), n);
        r.finish();
    }
}
