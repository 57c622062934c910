//! L2 behaviour, frame accounting and malformed input, on the sim driver (no root needed).

use std::sync::Arc;

use wasmswitch_core::fdb::Fdb;
use wasmswitch_core::pipeline::{Pipeline, PipelineOptions, PortSlot};
use wasmswitch_core::pool::{check_no_leak, AllocMode, PoolCache, SharedPool};
use wasmswitch_core::stats::{DropReason, WorkerStats};
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_core::vlan::{PortL2, PortVlan, StormLimits, Vid};
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

/// The host port's own MAC in rigs with a host port.
const HOST_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xee]);

fn mac(i: u8) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, i])
}

fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    udp4_frame(dst, src, [10, 0, 0, src.0[5]], [10, 0, 0, dst.0[5]], 1000, 2000, 64)
}

/// `ports` sim ports fed by injection queues, capturing what they transmit.
fn rig(ports: usize, frames: u32, aging: u32) -> Rig {
    rig_with(vec![PortL2::default(); ports], None, frames, aging)
}

/// Sim ports with these L2 settings (the last one the host port when `host`).
fn rig_with(l2: Vec<PortL2>, host: Option<PortId>, frames: u32, aging: u32) -> Rig {
    let ports = l2.len();
    let umem = Arc::new(Umem::new(frames, 2048).unwrap());
    let pool = SharedPool::new(wasmswitch_core::pool::PoolId(0), umem.clone(), 256);
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
            PortSlot::new(vec![Box::new(q)], 1522)
        })
        .zip(l2)
        .map(|(s, l2)| s.with_l2(l2))
        .collect();
    let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let stats = Arc::new(WorkerStats::new(0, ports, cache.stats().clone()));
    let opts = PipelineOptions { host_port: host, host_mac: host.map(|_| HOST_MAC), ..Default::default() };
    let pipe = Pipeline::new(slots, cache, fdb.clone(), stats, opts);
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
    assert_eq!(r.fdb.lookup(vid(1), mac(1)), Some(PortId(0)), "source learned on its ingress port");

    let reply = frame(mac(1), mac(2));
    r.send(1, reply.clone());
    let out = r.take();
    assert_eq!(out[0], vec![reply], "known unicast goes to the learned port");
    assert!(out[1].is_empty() && out[2].is_empty(), "and nowhere else");
    assert_eq!(r.fdb.lookup(vid(1), mac(2)), Some(PortId(1)));

    let again = frame(mac(2), mac(1));
    r.send(0, again.clone());
    let out = r.take();
    assert_eq!(out[1], vec![again]);
    assert!(out[0].is_empty() && out[2].is_empty());
    r.finish();
}

#[test]
fn broadcast_floods_to_all_other_ports_of_its_vlan() {
    let mut r = rig(4, 1024, 300);
    let b = frame(MacAddr::BROADCAST, mac(9));
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
    // Every port is an access port of VLAN 1 by default: a frame tagged 100 is not admitted.
    let mut t = b.clone();
    insert_vlan(&mut t, 100);
    r.send(2, t);
    assert!(r.take().iter().all(Vec::is_empty));
    assert_eq!(r.pipe.stats().ports[2].drops[DropReason::VlanFiltered as usize].get(), 1);
    r.finish();
}

fn vid(v: u16) -> Vid {
    Vid::new(v).unwrap()
}

fn access(v: u16) -> PortL2 {
    PortL2 { vlan: PortVlan::access(vid(v)), ..Default::default() }
}

fn trunk(allowed: &[u16], native: Option<u16>) -> PortL2 {
    PortL2 { vlan: PortVlan::trunk(allowed.iter().map(|&v| vid(v)), native.map(vid)), ..Default::default() }
}

/// `f` with an 802.1Q tag of this priority and VID.
fn tagged(f: &[u8], pcp: u8, v: u16) -> Vec<u8> {
    let mut t = f.to_vec();
    insert_vlan(&mut t, v);
    t[14] |= pcp << 5;
    t
}

/// Ports: 0 and 1 access 10, 2 trunk [10, 20] native 1, 3 access 20, 4 access 1.
fn vlan_rig() -> Rig {
    rig_with(vec![access(10), access(10), trunk(&[10, 20], Some(1)), access(20), access(1)], None, 1024, 300)
}

#[test]
fn vlans_switch_like_the_linux_bridge_tags_pushed_and_popped_in_place() {
    let mut r = vlan_rig();
    let none: Vec<Vec<u8>> = Vec::new();
    // Untagged from an access port: its VLAN's access ports untagged, the trunk tagged.
    let b = frame(MacAddr::BROADCAST, mac(1));
    r.send(0, b.clone());
    let out = r.take();
    assert_eq!(out[1], vec![b.clone()]);
    assert_eq!(out[2], vec![tagged(&b, 0, 10)], "pushed into the headroom");
    assert_eq!((&out[3], &out[4]), (&none, &none), "other VLANs see nothing");
    // Tagged 20 from the trunk: popped for VLAN 20's access port only.
    let b2 = frame(MacAddr::BROADCAST, mac(2));
    r.send(2, tagged(&b2, 3, 20));
    let out = r.take();
    assert_eq!(out[3], vec![b2.clone()], "popped");
    assert!(out[0].is_empty() && out[1].is_empty() && out[4].is_empty());
    // Untagged on the trunk: its native VLAN 1.
    r.send(2, b2.clone());
    let out = r.take();
    assert_eq!(out[4], vec![b2.clone()]);
    assert!(out[0].is_empty() && out[3].is_empty());
    // Not a member: filtered and counted.
    r.send(2, tagged(&b2, 0, 30));
    r.send(3, tagged(&b2, 0, 10));
    assert!(r.take().iter().all(Vec::is_empty));
    let filtered = |r: &Rig, p: usize| r.pipe.stats().ports[p].drops[DropReason::VlanFiltered as usize].get();
    assert_eq!((filtered(&r, 2), filtered(&r, 3)), (1, 1));
    // An access port takes its own VLAN tagged (as the bridge does), and a priority tag takes
    // the PVID keeping its PCP.
    r.send(1, tagged(&b, 0, 10));
    let out = r.take();
    assert_eq!((&out[0], &out[2]), (&vec![b.clone()], &vec![tagged(&b, 0, 10)]));
    r.send(0, tagged(&b, 5, 0));
    let out = r.take();
    assert_eq!(out[1], vec![b.clone()]);
    assert_eq!(out[2], vec![tagged(&b, 5, 10)], "VID 0 became 10, PCP 5 kept");
    // An 802.1ad outer tag is not the bridge's tag: the frame is untagged, switched in the PVID.
    let mut qinq = b.clone();
    insert_vlan(&mut qinq, 77);
    qinq[12..14].copy_from_slice(&0x88a8u16.to_be_bytes());
    r.send(0, qinq.clone());
    let out = r.take();
    assert_eq!(out[1], vec![qinq.clone()]);
    assert_eq!(out[2], vec![tagged(&qinq, 0, 10)], "an 802.1Q tag pushed outside the 802.1ad one");
    r.finish();
}

#[test]
fn learning_is_per_vlan() {
    let mut r = vlan_rig();
    // mac(1) speaks in VLAN 10 on port 0 and in VLAN 20 from the trunk.
    r.send(0, frame(MacAddr::BROADCAST, mac(1)));
    r.send(2, tagged(&frame(MacAddr::BROADCAST, mac(1)), 0, 20));
    r.take();
    assert_eq!(r.fdb.lookup(vid(10), mac(1)), Some(PortId(0)));
    assert_eq!(r.fdb.lookup(vid(20), mac(1)), Some(PortId(2)));
    // To mac(1) in VLAN 20 from port 3: the trunk only, tagged.
    let f = frame(mac(1), mac(3));
    r.send(3, f.clone());
    let out = r.take();
    assert_eq!(out[2], vec![tagged(&f, 0, 20)]);
    assert!(out[0].is_empty() && out[1].is_empty());
    // To mac(1) in VLAN 10 from port 1: port 0 only.
    r.send(1, f.clone());
    let out = r.take();
    assert_eq!(out[0], vec![f.clone()]);
    assert!(out[2].is_empty());
    // A static entry: not moved by learning.
    r.fdb.add_static(vid(10), mac(5), PortId(1)).unwrap();
    r.send(0, frame(MacAddr::BROADCAST, mac(5)));
    r.take();
    assert_eq!(r.fdb.lookup(vid(10), mac(5)), Some(PortId(1)));
    r.finish();
}

#[test]
fn a_source_with_no_room_to_be_learned_is_counted_and_still_forwarded() {
    let mut r = rig(2, 512, 300);
    // A port at its limit of learned entries: nothing more is learned from it.
    r.fdb.set_max_learned(PortId(0), 1);
    r.send(0, frame(MacAddr::BROADCAST, mac(2)));
    r.take();
    let f = frame(MacAddr::BROADCAST, mac(1));
    for n in 1..=2 {
        r.send(0, f.clone());
        assert_eq!(r.take()[1], vec![f.clone()], "forwarded all the same");
        assert_eq!(r.pipe.stats().ports[0].learn_refused.get(), n);
    }
    assert_eq!(r.fdb.lookup(vid(1), mac(1)), None);
    assert_eq!((r.pipe.stats().fdb_learned.get(), r.pipe.stats().fdb_not_learned.get()), (1, 0));
    r.finish();
}

/// One port floods random source MACs, far more than its `fdb.max_macs` and than the table
/// holds: exactly the limit is learned from it, every other new source counted as refused, and
/// the other ports' hosts, learned before the flood, keep their entries: their unicast still
/// goes to one port, never flooded to the flooding port. (Without the limit the flood takes
/// the whole table, the hosts' older entries evicted first.)
#[test]
fn a_mac_flood_from_a_port_with_a_limit_learns_only_the_limit() {
    const LIMIT: u32 = 100;
    const FLOOD: u64 = 3000;
    let mut r = rig(3, 1024, 300);
    r.fdb.set_max_learned(PortId(0), LIMIT);
    // Hosts on ports 1 and 2, learned at tick 0.
    r.send(1, frame(MacAddr::BROADCAST, mac(1)));
    r.send(2, frame(mac(1), mac(2)));
    r.take();
    // Distinct, scattered station addresses (a counter, multiplied and folded; local,
    // individual), from tick 1 on.
    r.pipe.set_now(1);
    let random_mac = |i: u64| {
        let mut x = i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 29;
        MacAddr::from_u64((x & 0xfeff_ffff_ffff) | 0x0200_0000_0000)
    };
    let mut sources = std::collections::HashSet::new();
    for chunk in (0..FLOOD).collect::<Vec<_>>().chunks(200) {
        for &i in chunk {
            assert!(sources.insert(random_mac(i)), "distinct sources");
            r.inject[0].lock().unwrap().push_back(frame(mac(77), random_mac(i)));
        }
        while r.pipe.poll() > 0 {}
        let out = r.take();
        assert_eq!((out[1].len(), out[2].len()), (chunk.len(), chunk.len()), "every frame forwarded (flooded)");
    }
    // The hosts' unicast: to one port, none flooded to the flood's port.
    for _ in 0..10 {
        r.send(1, frame(mac(2), mac(1)));
        r.send(2, frame(mac(1), mac(2)));
    }
    let out = r.take();
    assert_eq!((out[0].len(), out[1].len(), out[2].len()), (0, 10, 10), "unicast, none flooded to the flood's port");
    let on_0 = r.fdb.entries(0).iter().filter(|e| e.port == PortId(0)).count();
    assert_eq!((on_0, r.fdb.learned_on(PortId(0))), (LIMIT as usize, LIMIT), "learned from the flooding port");
    let refused = r.pipe.stats().ports[0].learn_refused.get();
    assert_eq!(refused, FLOOD - LIMIT as u64, "every other source counted as refused");
    assert_eq!((r.fdb.lookup(vid(1), mac(1)), r.fdb.lookup(vid(1), mac(2))), (Some(PortId(1)), Some(PortId(2))));
    assert_eq!(r.pipe.stats().ports[1].learn_refused.get() + r.pipe.stats().ports[2].learn_refused.get(), 0);
    assert_eq!(r.pipe.stats().fdb_evicted.get(), 0, "the flood evicted nothing");
    // A raised limit lets the next new source in.
    r.fdb.set_max_learned(PortId(0), LIMIT + 1);
    r.send(0, frame(mac(77), random_mac(FLOOD)));
    assert_eq!(r.fdb.learned_on(PortId(0)), LIMIT + 1);
    r.take();
    r.finish();
}

#[test]
fn link_local_frames_go_to_the_host_port_never_forwarded() {
    let ll = |last: u8| frame(MacAddr([0x01, 0x80, 0xc2, 0, 0, last]), mac(1));
    // Port 2 is the host port.
    let mut r = rig_with(vec![access(1), access(1), access(1)], Some(PortId(2)), 512, 300);
    for last in [0x00, 0x02, 0x0e] {
        r.send(0, ll(last));
    }
    let out = r.take();
    assert!(out[1].is_empty(), "not forwarded");
    assert_eq!(out[2], vec![ll(0), ll(2), ll(0x0e)]);
    assert_eq!(r.pipe.stats().ports[0].link_local.get(), 3);
    // 01:80:C2:00:00:10 is an ordinary multicast.
    r.send(0, ll(0x10));
    assert_eq!(r.take()[1], vec![ll(0x10)]);
    r.finish();
    // Switched in their port's VLAN up to the host port, which gets them in its form of that
    // VLAN (the README's difference from the bridge, which passes them up as they came): from
    // an access port of VLAN 10 to a host port of VLAN 1, tagged 10; tagged 20 from a trunk to
    // a host port whose native VLAN is 20, untagged (the PCP goes with the tag); tagged 30 on
    // a trunk without 30, dropped as `vlan_filtered`.
    let mut r = rig_with(vec![access(10), trunk(&[20], None), access(1)], Some(PortId(2)), 512, 300);
    r.send(0, ll(0x0e));
    assert_eq!(r.take()[2], vec![tagged(&ll(0x0e), 0, 10)]);
    r.finish();
    let mut r = rig_with(vec![access(10), trunk(&[20], None), trunk(&[10], Some(20))], Some(PortId(2)), 512, 300);
    r.send(1, tagged(&ll(0x0e), 5, 20));
    assert_eq!(r.take()[2], vec![ll(0x0e)]);
    r.send(1, tagged(&ll(0x0e), 0, 30));
    assert!(r.take().iter().all(Vec::is_empty));
    assert_eq!(r.pipe.stats().ports[1].drops[DropReason::VlanFiltered as usize].get(), 1);
    r.finish();
    let mut r = rig_with(vec![access(1), access(1)], None, 512, 300);
    r.send(0, ll(0x0e));
    assert!(r.take().iter().all(Vec::is_empty));
    assert_eq!(r.pipe.stats().ports[0].drops[DropReason::LinkLocal as usize].get(), 1);
    r.finish();
}

#[test]
fn group_and_zero_source_addresses_are_dropped_never_learned() {
    // The Linux bridge's rule (is_valid_ether_addr): no station sends from a group or an
    // all-zero address.
    let mut r = rig(2, 512, 300);
    let bad = [MacAddr([0x01, 0, 0x5e, 0, 0, 1]), MacAddr::BROADCAST, MacAddr([0; 6])];
    for src in bad {
        r.send(0, frame(MacAddr::BROADCAST, src));
        r.send(0, frame(mac(9), src));
    }
    assert!(r.take().iter().all(Vec::is_empty), "nothing forwarded");
    assert_eq!(r.pipe.stats().ports[0].drops[DropReason::BadSource as usize].get(), 6);
    for src in bad {
        assert_eq!(r.fdb.lookup(vid(1), src), None, "{src} not learned");
    }
    // A station's frame right after still goes.
    r.send(0, frame(MacAddr::BROADCAST, mac(1)));
    assert_eq!(r.take()[1].len(), 1);
    r.finish();
}

#[test]
fn the_host_mac_is_learned_on_the_host_port_only() {
    // Port 2 is the host port; its MAC is HOST_MAC.
    let mut r = rig_with(vec![access(1), access(1), access(1)], Some(PortId(2)), 512, 300);
    r.send(2, frame(MacAddr::BROADCAST, HOST_MAC));
    r.take();
    assert_eq!(r.fdb.lookup(vid(1), HOST_MAC), Some(PortId(2)));
    // Port 0 spoofs it: forwarded, never learned on port 0.
    r.send(0, frame(mac(1), HOST_MAC));
    r.send(0, frame(MacAddr::BROADCAST, HOST_MAC));
    let out = r.take();
    assert_eq!((out[0].len(), out[1].len(), out[2].len()), (0, 2, 2), "both flood: unknown unicast and broadcast");
    assert_eq!(r.fdb.lookup(vid(1), HOST_MAC), Some(PortId(2)), "still the host port's");
    assert_eq!(r.pipe.stats().ports[0].own_address.get(), 2);
    // Traffic to the host still goes to the host port.
    r.send(1, frame(HOST_MAC, mac(5)));
    assert_eq!(r.take()[2].len(), 1);
    r.finish();
}

#[test]
fn storm_control_drops_floods_past_the_limit_per_second() {
    let limited = PortL2 { storm: StormLimits { pps: [Some(3), Some(0), Some(2)] }, ..access(1) };
    let mut r = rig_with(vec![limited, access(1)], None, 512, 300);
    for i in 0..10 {
        r.send(0, frame(MacAddr::BROADCAST, mac(i)));
    }
    r.send(0, frame(MacAddr([0x01, 0, 0x5e, 0, 0, 1]), mac(1)));
    for i in 0..5 {
        r.send(0, frame(mac(100 + i), mac(1)));
    }
    assert_eq!(r.take()[1].len(), 3 + 2, "3 broadcasts, no multicast, 2 unknown unicasts");
    assert_eq!(r.pipe.stats().ports[0].drops[DropReason::Storm as usize].get(), 7 + 1 + 3);
    // Known unicast is not a flood: never limited.
    r.send(1, frame(MacAddr::BROADCAST, mac(50)));
    r.take();
    for _ in 0..5 {
        r.send(0, frame(mac(50), mac(1)));
    }
    assert_eq!(r.take()[1].len(), 5);
    // The next second admits again.
    r.pipe.set_now(1);
    r.send(0, frame(MacAddr::BROADCAST, mac(1)));
    assert_eq!(r.take()[1].len(), 1);
    r.finish();
}

#[test]
fn mirrors_copy_what_a_port_receives_and_sends() {
    // Port 3 is the destination: it takes no part in switching.
    let mut l2 = vec![
        access(1),
        trunk(&[1, 10], None),
        access(10),
        PortL2 { mirror_destination: true, vlan: PortVlan::none(), ..Default::default() },
    ];
    l2[0].mirror_ingress = vec![PortId(3)];
    l2[1].mirror_egress = vec![PortId(3)];
    let mut r = rig_with(l2, None, 1024, 300);
    let b = frame(MacAddr::BROADCAST, mac(1));
    r.send(0, b.clone());
    let out = r.take();
    assert_eq!(out[1], vec![tagged(&b, 0, 1)]);
    // As received on port 0, then as sent on port 1.
    assert_eq!(out[3], vec![b.clone(), tagged(&b, 0, 1)]);
    assert_eq!(r.pipe.stats().mirror_copies.get(), 2);
    // Port 2's frame leaves port 1 tagged 10: mirrored; received on port 3: dropped.
    r.send(2, b.clone());
    assert_eq!(r.take()[3], vec![tagged(&b, 0, 10)]);
    r.send(3, b.clone());
    assert!(r.take().iter().all(Vec::is_empty));
    assert_eq!(r.pipe.stats().ports[3].drops[DropReason::MirrorDestination as usize].get(), 1);
    r.finish();
}

/// Records the metadata of every packet it is shown and passes them all.
#[derive(Default)]
struct SeeMeta(Arc<std::sync::Mutex<Vec<wasmswitch_core::wire::PacketMeta>>>);

impl VerdictStage for SeeMeta {
    fn run(&mut self, batch: &BatchView<'_>, _: &mut [Verdict]) {
        self.0.lock().unwrap().extend_from_slice(batch.meta);
    }
}

#[test]
fn parsing_goes_past_the_tags_only_where_something_looks() {
    // An IPv4 header with IHL 3: malformed past L2. The destination is learned on port 1.
    let mut r = rig(3, 1024, 300);
    r.send(1, frame(mac(9), mac(2)));
    r.take();
    let mut bad = frame(mac(2), mac(1));
    bad[14] = 0x43;
    // Port 0 has no plugin and completes no checksums: a bridge, it forwards the frame as is.
    r.send(0, bad.clone());
    assert_eq!(r.take()[1], vec![bad.clone()], "switched on its Ethernet header");
    let st = &r.pipe.stats().ports[0];
    assert_eq!(st.drops[DropReason::BadL3 as usize].get(), 0);
    // With a stage on port 0, the frame is parsed to L4 for it, and dropped as malformed.
    let seen = SeeMeta::default();
    let log = seen.0.clone();
    r.pipe.set_ingress(PortId(0), Some(Box::new(seen)));
    r.send(0, bad);
    assert!(r.take()[1].is_empty());
    assert_eq!(r.pipe.stats().ports[0].drops[DropReason::BadL3 as usize].get(), 1);
    // A good frame reaches the stage fully parsed, after L2-only frames used the same slot.
    let good = frame(mac(2), mac(1));
    r.send(0, good.clone());
    assert_eq!(r.take()[1], vec![good.clone()]);
    let meta = log.lock().unwrap().clone();
    assert_eq!(
        meta,
        vec![wasmswitch_core::wire::parse(&good, 1522)
            .map(|m| wasmswitch_core::wire::PacketMeta { vlan: 1, ..m })
            .unwrap()]
    );
    // Runts are dropped either way: the Ethernet header is always read.
    r.pipe.set_ingress(PortId(0), None);
    r.send(0, good[..13].to_vec());
    assert_eq!(r.pipe.stats().ports[0].drops[DropReason::Runt as usize].get(), 1);
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
    assert_eq!(r.fdb.lookup(vid(1), mac(1)), Some(PortId(0)));
    r.send(2, frame(MacAddr::BROADCAST, mac(1)));
    assert_eq!(r.fdb.lookup(vid(1), mac(1)), Some(PortId(2)), "station moved");
    assert_eq!(r.pipe.stats().fdb_moved.get(), 1);
    r.take();
    r.fdb.age(11);
    assert_eq!(r.fdb.lookup(vid(1), mac(1)), None, "aged out after 10 silent ticks");
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
                1 => Verdict::Redirect(PortId(self.0.u16(0..self.1 + 2))),
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
    let pool = SharedPool::new(wasmswitch_core::pool::PoolId(0), umem.clone(), 64);
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
            0 => f.truncate(rng.usize(0..14)),                                     // runt
            1 => f.truncate(20),                                                   // truncated IPv4
            2 => f = (0..rng.usize(14..200)).map(|_| rng.u8(..)).collect(),        // random bytes
            3 => f.resize(1600, 0),                                                // oversize
            4 => insert_vlan(&mut f, 100),                                         // tagged
            5 => insert_vlan(&mut f, [0, 1, 7][rng.usize(0..3)]),                  // priority, native, foreign
            6 => f[..6].copy_from_slice(&[0x01, 0x80, 0xc2, 0, 0, rng.u8(0..16)]), // link-local
            _ => {}
        }
        gen_frames.push(f);
    }
    // Trunk, access, access with mirrors and storm limits, host: every tag push, pop, copy
    // and drop path.
    let mut l2 = vec![trunk(&[1, 100], Some(1)), access(100), access(1), access(1)];
    l2[1].mirror_ingress = vec![PortId(2)];
    l2[0].mirror_egress = vec![PortId(1)];
    l2[2].storm = StormLimits { pps: [Some(50), Some(10), Some(20)] };
    let slots = (0..nports)
        .zip(l2)
        .map(|(p, l2)| {
            let mut frames = gen_frames.clone();
            frames.rotate_left(p as usize * 37);
            let q = SimQueue::new(
                umem.clone(),
                SimRings { fill: 128, tx: 96 },
                Source::Gen(TrafficGen::from_frames(frames)),
            );
            PortSlot::new(vec![Box::new(q)], 1522)
                .with_ingress(Some(Box::new(RandomVerdicts(fastrand::Rng::with_seed(p as u64), nports))))
                .with_l2(l2)
        })
        .collect();
    let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let stats = Arc::new(WorkerStats::new(0, nports as usize, cache.stats().clone()));
    let opts = PipelineOptions { host_port: Some(PortId(3)), ..Default::default() };
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
            pipe.set_port_up(PortId(1), !round.is_multiple_of(3000));
        }
    }
    pipe.shutdown();
    drop(pipe);
    check_no_leak(&pool, &[]).expect("every frame is back exactly once");
    let drops: u64 = stats.ports.iter().map(|p| p.drops_total()).sum();
    for r in [
        DropReason::Runt,
        DropReason::BadL3,
        DropReason::Oversize,
        DropReason::Policy,
        DropReason::BadRedirect,
        DropReason::VlanFiltered,
        DropReason::Storm,
    ] {
        let n: u64 = stats.ports.iter().map(|p| p.drops[r as usize].get()).sum();
        assert!(n > 0, "{r:?} drops were counted");
    }
    assert!(drops < received as u64);
    assert!(stats.pool.alloc_fast.get() > 0);
    assert!(stats.mirror_copies.get() > 0);
}

/// A verdict stage that passes everything (the verdicts come preset to `Pass`).
struct PassAll;

impl VerdictStage for PassAll {
    fn run(&mut self, _: &BatchView<'_>, _: &mut [Verdict]) {}
}

/// What a rig did, port by port: the frames each sent, and its counters.
fn outcome(r: &mut Rig) -> (Vec<Vec<Vec<u8>>>, Vec<Vec<u64>>) {
    let counters = r
        .pipe
        .stats()
        .ports
        .iter()
        .map(|p| {
            let mut c = vec![p.rx_packets.get(), p.tx_packets.get(), p.link_local.get(), p.own_address.get()];
            c.extend(p.drops.iter().map(|d| d.get()));
            c
        })
        .collect();
    (r.take(), counters)
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

    /// A port with a verdict stage that passes everything switches exactly as a plain port:
    /// the plain port's own parse and forwarding loops (no verdicts, no metadata) must not
    /// change what L2 does. Well-formed frames (a plugin's port parses to L4) from every port,
    /// with every kind of address (group, zero, link-local, the host's, learned, unknown) and
    /// of tag (none, priority, member VLANs, a VLAN no port carries).
    #[test]
    fn a_plain_port_switches_as_a_port_whose_plugin_passes_everything(
        frames in proptest::collection::vec((0usize..4, 0usize..8, 0usize..8, 0usize..5), 1..120)
    ) {
        let l2 = || vec![access(1), trunk(&[1, 10], Some(1)), trunk(&[10, 20], None), access(1)];
        let mut plain = rig_with(l2(), Some(PortId(3)), 1024, 300);
        let mut staged = rig_with(l2(), Some(PortId(3)), 1024, 300);
        for p in 0..4 {
            staged.pipe.set_ingress(PortId(p), Some(Box::new(PassAll)));
        }
        let macs = [
            mac(1), mac(2), mac(3), HOST_MAC, MacAddr::BROADCAST,
            MacAddr([0x01, 0, 0x5e, 0, 0, 1]), MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x0e]), MacAddr([0; 6]),
        ];
        // In bursts, so that a batch holds several frames and drops compact it.
        for burst in frames.chunks(8) {
            for &(port, dst, src, tag) in burst {
                let f = frame(macs[dst], macs[src]);
                let f = match tag {
                    0 => f,
                    1 => tagged(&f, 3, 0),
                    2 => tagged(&f, 0, 1),
                    3 => tagged(&f, 0, 10),
                    _ => tagged(&f, 0, 30),
                };
                plain.inject[port].lock().unwrap().push_back(f.clone());
                staged.inject[port].lock().unwrap().push_back(f);
            }
            while plain.pipe.poll() > 0 {}
            while staged.pipe.poll() > 0 {}
            proptest::prop_assert_eq!(outcome(&mut plain), outcome(&mut staged));
        }
        plain.finish();
        staged.finish();
    }
}
