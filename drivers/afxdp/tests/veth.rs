//! End-to-end tests on veth pairs in private network namespaces.
//!
//! Each test builds its own namespaces (unique names, deleted by an RAII guard even on panic):
//! a "switch" namespace holding the switch-side veth ends, and one peer namespace per link
//! holding the other end. Switch-side code runs in a thread that entered the switch namespace;
//! traffic is sent and captured with AF_PACKET sockets created inside the peer namespaces.
//!
//! Without root or network namespaces the tests print why and pass, unless `CI=true`, where
//! they fail instead.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmswitch_testkit::env::Need;

use wasmswitch_afxdp::{AfXdpError, AfXdpPort, Overrides, PortSpec, UmemRegistration};
use wasmswitch_core::fdb::Fdb;
use wasmswitch_core::pipeline::{Pipeline, PipelineOptions, PortSlot};
use wasmswitch_core::pool::{check_no_leak, AllocMode};
use wasmswitch_core::stats::WorkerStats;
use wasmswitch_core::wire::build::udp4_frame;
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::{BulkReturn, Desc, PoolCache, PortQueue, SharedPool, Umem};

// ---- environment ----------------------------------------------------------------------------

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn must(args: &[&str]) -> String {
    ip(args).unwrap_or_else(|e| panic!("{e}"))
}

/// True when the test can run (see [`wasmswitch_testkit::env::ready`]).
fn env_ready(test: &str) -> bool {
    wasmswitch_testkit::env::ready(test, &[Need::Root, Need::Netns])
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A network namespace deleted on drop (its veth ends go with it, and so do their peers).
struct Netns(String);

impl Netns {
    fn new(role: &str) -> Self {
        let name = format!("wsx{}-{}{}", std::process::id(), role, SEQ.fetch_add(1, Ordering::Relaxed));
        must(&["netns", "add", &name]);
        let ns = Netns(name);
        // No IPv6 autoconf chatter (MLD, router solicitations) on the test links.
        for key in ["all", "default"] {
            let _ = Command::new("ip")
                .args(["netns", "exec", &ns.0, "sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=1")])
                .status();
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// A switch namespace with `links` veth pairs: `swN` in the switch namespace, `peN` in peer N's.
struct Lab {
    sw: Netns,
    peers: Vec<Netns>,
}

impl Lab {
    fn new(links: usize, queues: u32) -> Self {
        let sw = Netns::new("s");
        let q = queues.to_string();
        let peers: Vec<Netns> = (0..links).map(|_| Netns::new("p")).collect();
        for (i, p) in peers.iter().enumerate() {
            let (s, e) = (format!("sw{i}"), format!("pe{i}"));
            must(&[
                "-n",
                &sw.0,
                "link",
                "add",
                &s,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "type",
                "veth",
                "peer",
                "name",
                &e,
                "netns",
                &p.0,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
            ]);
            must(&["-n", &sw.0, "link", "set", &s, "up"]);
            must(&["-n", &p.0, "link", "set", &e, "up"]);
        }
        Lab { sw, peers }
    }

    fn xdp_shown(&self, dev: &str) -> bool {
        let out = must(&["-n", &self.sw.0, "-d", "link", "show", "dev", dev]);
        out.contains("xdp")
    }

    /// True once `dev` has no XDP program. Closing the link detaches synchronously, but another
    /// test thread forking `ip` at that moment holds a copy of every fd until its exec, so allow
    /// that child a moment.
    fn xdp_gone(&self, dev: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.xdp_shown(dev) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

/// Runs `f` on a thread that entered network namespace `ns`.
fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns on this thread only, with a namespace fd we hold open.
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
            f()
        });
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

fn pin_to_cpu(cpu: usize) {
    wasmswitch_sys::pin_to_cpu(cpu).unwrap_or_else(|e| panic!("sched_setaffinity({cpu}): {e}"));
}

// ---- AF_PACKET peer -------------------------------------------------------------------------

struct Packet {
    fd: OwnedFd,
}

const PACKET_QDISC_BYPASS: libc::c_int = 20;

impl Packet {
    /// An AF_PACKET socket on `dev` in namespace `ns`. With `cpu`, frames are sent from a thread
    /// pinned to that CPU, which (qdisc bypass, no XPS on veth) picks TX queue `cpu % queues`,
    /// and veth hands a frame sent on TX queue N to the peer's RX queue N.
    fn open(ns: &str, dev: &str) -> Packet {
        let dev = dev.to_string();
        in_netns(ns, move || {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket creation, checked below.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as i32) };
            assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
            // SAFETY: fresh descriptor.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let ifindex = wasmswitch_sys::ifindex(&dev).expect("peer interface") as i32;
            // SAFETY: zeroed sockaddr_ll is valid; fields set below.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex;
            // SAFETY: valid sockaddr_ll with its size.
            let r = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(r, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
            let one: libc::c_int = 1;
            // SAFETY: int option.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_PACKET,
                    PACKET_QDISC_BYPASS,
                    (&one as *const libc::c_int).cast(),
                    4,
                )
            };
            Packet { fd }
        })
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: sends `frame.len()` bytes from `frame`.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(r, frame.len() as isize, "AF_PACKET send: {}", std::io::Error::last_os_error());
    }

    fn send_from_cpu(&self, cpu: usize, frames: &[Vec<u8>]) {
        std::thread::scope(|s| {
            s.spawn(|| {
                pin_to_cpu(cpu);
                for f in frames {
                    self.send(f);
                }
            });
        });
    }

    /// Incoming frames (not our own outgoing ones) that `keep` accepts, until `want` arrived or
    /// `timeout` passed.
    fn recv(&self, want: usize, timeout: Duration, keep: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        while got.len() < want && Instant::now() < deadline {
            let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 20) } <= 0 {
                continue;
            }
            // SAFETY: zeroed sockaddr_ll is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buffer and address with their sizes.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n > 0 && from.sll_pkttype != libc::PACKET_OUTGOING && keep(&buf[..n as usize]) {
                got.push(buf[..n as usize].to_vec());
            }
        }
        got
    }
}

// ---- helpers --------------------------------------------------------------------------------

const M0: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x10]);
const M1: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x11]);
const SW: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x99]);

/// A UDP frame with a sequence number in its source port.
fn frame(dst: MacAddr, src: MacAddr, seq: u16) -> Vec<u8> {
    udp4_frame(dst, src, [10, 0, 0, 1], [10, 0, 0, 2], 1000 + seq, 7777, 128)
}

fn is_ours(f: &[u8]) -> bool {
    f.len() >= 38 && f[36..38] == 7777u16.to_be_bytes()
}

fn src_mac(f: &[u8]) -> MacAddr {
    MacAddr::from_bytes(&f[6..12])
}

fn pool_for(frames: u32) -> (Arc<Umem>, Arc<SharedPool>) {
    let umem = Arc::new(Umem::new(frames, 2048).unwrap());
    let pool = SharedPool::new(wasmswitch_core::pool::PoolId(0), umem.clone(), 1024);
    (umem, pool)
}

fn small_rings() -> Overrides {
    Overrides {
        rings: Some(wasmswitch_afxdp::RingSizes { rx: 256, tx: 256, fill: 256, completion: 256 }),
        ..Default::default()
    }
}

/// Polls `q` until `want` packets arrived or the timeout passed.
fn rx_until(q: &mut dyn PortQueue, pool: &mut PoolCache, want: usize, timeout: Duration) -> Vec<Desc> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut out = [Desc::default(); 64];
    while got.len() < want && Instant::now() < deadline {
        let n = q.rx_burst(pool, &mut out);
        got.extend_from_slice(&out[..n]);
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

fn open(ns: &str, spec: PortSpec, reg: &UmemRegistration) -> Result<AfXdpPort, AfXdpError> {
    in_netns(ns, || AfXdpPort::open(&spec, reg))
}

// ---- tests ----------------------------------------------------------------------------------

#[test]
fn rx_and_tx_on_a_veth_and_every_frame_comes_back() {
    if !env_ready("rx_and_tx_on_a_veth_and_every_frame_comes_back") {
        return;
    }
    let lab = Lab::new(1, 1);
    let (umem, shared) = pool_for(1024);
    let reg = UmemRegistration::new(umem.clone());
    let mut port = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap();
    assert_eq!(port.decision().profile, "veth");
    assert_eq!(port.decision().bind, wasmswitch_afxdp::BindMode::Copy);
    assert!(lab.xdp_shown("sw0"), "program attached");
    let mut queues = port.take_queues();
    assert_eq!(queues.len(), 1);
    let (qid, mut q) = queues.pop().unwrap();
    assert_eq!(qid, 0);
    let mut pool = PoolCache::new(shared.clone(), 128, AllocMode::Recycling);

    // Prime the fill ring, then send from the peer.
    assert_eq!(q.rx_burst(&mut pool, &mut [Desc::default(); 64]), 0);
    assert_eq!(q.frames_held(), 256, "fill ring topped up to its size");
    let peer = Packet::open(&lab.peers[0].0, "pe0");
    for i in 0..20 {
        peer.send(&frame(SW, M0, i));
    }
    let got = rx_until(&mut q, &mut pool, 20, Duration::from_secs(3));
    assert_eq!(got.len(), 20, "received on the AF_XDP socket");
    for (i, d) in got.iter().enumerate() {
        // SAFETY: the descriptor came from our RX ring, so we hold the frame.
        let bytes = unsafe { umem.bytes(d.addr, d.len as usize) };
        assert_eq!(bytes, &frame(SW, M0, i as u16)[..], "frame {i} intact and in order");
    }

    // Send the same frames back out (rewriting the MACs in place) and read them at the peer.
    for d in &got {
        // SAFETY: we hold the frame.
        let b = unsafe { umem.bytes_mut(d.addr, 12) };
        b[0..6].copy_from_slice(&M0.0);
        b[6..12].copy_from_slice(&SW.0);
    }
    assert_eq!(q.tx_burst(&got), 20);
    q.flush_tx();
    let echoed = peer.recv(20, Duration::from_secs(3), |f| is_ours(f) && src_mac(f) == SW);
    assert_eq!(echoed.len(), 20, "TX reached the peer");

    let mut bulk = BulkReturn::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut done = 0;
    while done < 20 && Instant::now() < deadline {
        done += q.complete(&mut pool, &mut bulk);
    }
    bulk.flush(&mut pool);
    assert_eq!(done, 20, "every TX frame completed");
    let st = q.stats();
    assert!(st.tx_wakeups.get() >= 1, "copy mode asks for a TX kick");
    assert_eq!(st.tx_kick_errors.get(), 0);
    let xs = q.xdp_stats().expect("socket open");
    assert_eq!((xs.rx_invalid_descs, xs.tx_invalid_descs), (0, 0));

    // Shutdown: every frame back in the pool.
    q.release_all(&mut pool);
    assert_eq!(q.frames_held(), 0);
    drop(q);
    pool.drain();
    check_no_leak(&shared, &[]).unwrap();
    drop(port);
    assert!(lab.xdp_gone("sw0"), "no XDP program left after the port is dropped");
}

#[test]
fn forwards_between_two_veths_through_the_pipeline_on_one_umem() {
    if !env_ready("forwards_between_two_veths_through_the_pipeline_on_one_umem") {
        return;
    }
    let lab = Lab::new(2, 1);
    let (umem, shared) = pool_for(2048);
    let reg = UmemRegistration::new(umem);
    let mut p0 = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap();
    let mut p1 = open(&lab.sw.0, PortSpec { iface: "sw1".into(), overrides: small_rings() }, &reg).unwrap();
    let q0 = p0.take_boxed_queues().pop().unwrap().1;
    let q1 = p1.take_boxed_queues().pop().unwrap().1;
    let slot = |queue| PortSlot::new(vec![queue], 1518);
    let cache = PoolCache::new(shared.clone(), 128, AllocMode::Recycling);
    let stats = Arc::new(WorkerStats::new(0, 2, cache.stats().clone()));
    let mut pipe = Pipeline::new(
        vec![slot(q0), slot(q1)],
        cache,
        Arc::new(Fdb::new(1024, 300)),
        stats.clone(),
        PipelineOptions::default(),
    );
    pipe.poll(); // prime both fill rings

    let a = Packet::open(&lab.peers[0].0, "pe0");
    let b = Packet::open(&lab.peers[1].0, "pe1");
    let poll_until = |pipe: &mut Pipeline, peer: &Packet, want: usize, src: MacAddr| {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut got = Vec::new();
        while got.len() < want && Instant::now() < deadline {
            pipe.poll();
            got.extend(peer.recv(want - got.len(), Duration::from_millis(2), |f| is_ours(f) && src_mac(f) == src));
        }
        got
    };
    // Unknown destination: flooded to the only other port (the original frame, no copy).
    for i in 0..32 {
        a.send(&frame(M1, M0, i));
    }
    let got = poll_until(&mut pipe, &b, 32, M0);
    assert_eq!(got.len(), 32, "A -> B through the switch");
    assert_eq!(got[5], frame(M1, M0, 5));
    // B answers; M0 was learned on port 0, so this is a unicast.
    for i in 0..32 {
        b.send(&frame(M0, M1, i));
    }
    let got = poll_until(&mut pipe, &a, 32, M1);
    assert_eq!(got.len(), 32, "B -> A through the switch");
    assert_eq!(stats.flood_copies.get(), 0, "forwarding moved descriptors, it copied nothing");
    assert_eq!(stats.ports[0].rx_packets.get(), 32);
    assert_eq!(stats.ports[1].tx_packets.get(), 32);
    assert!(stats.fdb_learned.get() >= 2);

    // Let the last completions arrive, then shut down and account for every frame.
    for _ in 0..50 {
        pipe.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    pipe.shutdown();
    assert_eq!(pipe.frames_held(), 0);
    drop(pipe);
    check_no_leak(&shared, &[]).unwrap();
    drop((p0, p1));
    assert!(lab.xdp_gone("sw0") && lab.xdp_gone("sw1"));
}

#[test]
fn traffic_on_queue_one_of_a_two_queue_veth_is_received() {
    if !env_ready("traffic_on_queue_one_of_a_two_queue_veth_is_received") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipping: steering to queue 1 needs a second CPU");
        return;
    }
    let lab = Lab::new(1, 2);
    let (umem, shared) = pool_for(2048);
    let reg = UmemRegistration::new(umem);
    let mut port = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap();
    assert_eq!(port.decision().channels, 2, "veth reports its real queue count");
    assert_eq!(port.decision().queues, vec![0, 1]);
    let mut queues = port.take_queues();
    let mut pool = PoolCache::new(shared.clone(), 128, AllocMode::Recycling);
    for (_, q) in queues.iter_mut() {
        q.rx_burst(&mut pool, &mut [Desc::default(); 64]);
    }
    let peer = Packet::open(&lab.peers[0].0, "pe0");
    // Sent from CPU 1: TX queue 1 of pe0, hence RX queue 1 of sw0.
    let frames: Vec<Vec<u8>> = (0..16).map(|i| frame(SW, M0, i)).collect();
    peer.send_from_cpu(1, &frames);
    let (_, q1) = &mut queues[1];
    let got1 = rx_until(q1, &mut pool, 16, Duration::from_secs(3));
    let (_, q0) = &mut queues[0];
    let got0 = rx_until(q0, &mut pool, 1, Duration::from_millis(100));
    assert_eq!((got0.len(), got1.len()), (0, 16), "frames sent on queue 1 arrive on queue 1's socket");
    // And from CPU 0 they arrive on queue 0.
    peer.send_from_cpu(0, &frames);
    let (_, q0) = &mut queues[0];
    let got0b = rx_until(q0, &mut pool, 16, Duration::from_secs(3));
    assert_eq!(got0b.len(), 16);
    pool.put_bulk(&got1.iter().chain(&got0b).map(|d| d.addr).collect::<Vec<_>>());
    for (_, q) in queues.iter_mut() {
        q.release_all(&mut pool);
    }
    drop(queues);
    pool.drain();
    check_no_leak(&shared, &[]).unwrap();
}

#[test]
fn shared_tx_queue_sends_for_a_worker_without_its_own_queue() {
    if !env_ready("shared_tx_queue_sends_for_a_worker_without_its_own_queue") {
        return;
    }
    let lab = Lab::new(1, 1);
    let (umem, shared) = pool_for(1024);
    let reg = UmemRegistration::new(umem.clone());
    let mut port = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap();
    let (_, mut owner) = port.take_queues().pop().unwrap();
    let mut other = owner.share_tx();
    assert!(owner.has_rx() && !other.has_rx());
    let peer = Packet::open(&lab.peers[0].0, "pe0");

    // The second worker transmits through the shared TX half from its own thread and pool cache.
    let sent = std::thread::scope(|s| {
        s.spawn(|| {
            let mut pool = PoolCache::new(shared.clone(), 128, AllocMode::Recycling);
            let mut descs = Vec::new();
            for i in 0..10u16 {
                let a = pool.alloc().unwrap();
                let f = frame(M0, SW, i);
                // SAFETY: freshly allocated frame, ours.
                unsafe { umem.bytes_mut(a, f.len()).copy_from_slice(&f) };
                descs.push(Desc { addr: a, len: f.len() as u32, options: 0 });
            }
            let n = other.tx_burst(&descs);
            other.flush_tx();
            let mut bulk = BulkReturn::new();
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut done = 0;
            while done < n && Instant::now() < deadline {
                done += other.complete(&mut pool, &mut bulk);
            }
            bulk.flush(&mut pool);
            assert_eq!(done, n);
            other.release_all(&mut pool);
            n
        })
        .join()
        .unwrap()
    });
    assert_eq!(sent, 10);
    assert_eq!(peer.recv(10, Duration::from_secs(3), |f| is_ours(f) && src_mac(f) == SW).len(), 10);
    // The owner still receives, lock-free.
    let mut pool = PoolCache::new(shared.clone(), 128, AllocMode::Recycling);
    owner.rx_burst(&mut pool, &mut [Desc::default(); 64]);
    peer.send(&frame(SW, M0, 1));
    let got = rx_until(&mut owner, &mut pool, 1, Duration::from_secs(3));
    assert_eq!(got.len(), 1);
    pool.put(got[0].addr);
    owner.release_all(&mut pool);
    drop(owner);
    pool.drain();
    check_no_leak(&shared, &[]).unwrap();
}

#[test]
fn clear_errors_for_missing_interface_bad_queue_and_busy_hook() {
    if !env_ready("clear_errors_for_missing_interface_bad_queue_and_busy_hook") {
        return;
    }
    let lab = Lab::new(1, 2);
    let (umem, _shared) = pool_for(1024);
    let reg = UmemRegistration::new(umem);

    let e = open(&lab.sw.0, PortSpec::new("nosuch0"), &reg).unwrap_err();
    assert!(matches!(e, AfXdpError::InterfaceMissing { .. }), "{e}");
    assert!(e.to_string().contains("\"nosuch0\" does not exist"), "{e}");

    let spec =
        PortSpec { iface: "sw0".into(), overrides: Overrides { queues: Some(vec![0, 2]), ..Default::default() } };
    let e = open(&lab.sw.0, spec, &reg).unwrap_err();
    assert!(matches!(e, AfXdpError::QueueOutOfRange { queue: 2, channels: 2, .. }), "{e}");
    assert!(e.to_string().starts_with("interface sw0: queue 2 does not exist, the interface has 2 queue(s)"), "{e}");
    assert!(!lab.xdp_shown("sw0"), "nothing attached after a failed open");

    let spec = PortSpec {
        iface: "sw0".into(),
        overrides: Overrides { bind: Some(wasmswitch_afxdp::BindMode::ZeroCopy), ..small_rings() },
    };
    let e = open(&lab.sw.0, spec, &reg).unwrap_err();
    // veth declares its XDP features without zero-copy: refused before anything is created.
    assert!(matches!(e, AfXdpError::NoZeroCopy { .. }), "{e}");
    assert!(
        e.to_string().contains("(driver veth) does not offer AF_XDP zero-copy") && e.to_string().contains("bind: copy"),
        "{e}"
    );

    let first = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap();
    assert_eq!(reg.bind_mode(), Some(wasmswitch_afxdp::BindMode::Copy));
    // The UMEM is now bound in copy mode; a zero-copy port cannot share it.
    let spec = PortSpec {
        iface: "sw0".into(),
        overrides: Overrides { bind: Some(wasmswitch_afxdp::BindMode::ZeroCopy), ..small_rings() },
    };
    let e = open(&lab.sw.0, spec, &reg).unwrap_err();
    assert!(matches!(e, AfXdpError::UmemModeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("which sw0 queue 0 bound in copy mode"), "{e}");
    let e = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap_err();
    assert!(matches!(e, AfXdpError::AlreadyAttached { .. }), "{e}");
    assert!(e.to_string().starts_with("interface sw0 already has an XDP program attached (native"), "{e}");
    drop(first);
    assert!(lab.xdp_gone("sw0"));
}

#[test]
fn generic_attach_override_works_too() {
    if !env_ready("generic_attach_override_works_too") {
        return;
    }
    let lab = Lab::new(1, 1);
    let (umem, shared) = pool_for(1024);
    let reg = UmemRegistration::new(umem);
    let spec = PortSpec {
        iface: "sw0".into(),
        overrides: Overrides { attach: Some(wasmswitch_afxdp::AttachMode::Generic), ..small_rings() },
    };
    let mut port = open(&lab.sw.0, spec, &reg).unwrap();
    assert!(port.decision().overridden);
    assert!(must(&["-n", &lab.sw.0, "-d", "link", "show", "dev", "sw0"]).contains("xdpgeneric"));
    let (_, mut q) = port.take_queues().pop().unwrap();
    let mut pool = PoolCache::new(shared.clone(), 128, AllocMode::Recycling);
    q.rx_burst(&mut pool, &mut [Desc::default(); 64]);
    let peer = Packet::open(&lab.peers[0].0, "pe0");
    for i in 0..8 {
        peer.send(&frame(SW, M0, i));
    }
    let got = rx_until(&mut q, &mut pool, 8, Duration::from_secs(3));
    assert_eq!(got.len(), 8);
    pool.put_bulk(&got.iter().map(|d| d.addr).collect::<Vec<_>>());
    q.release_all(&mut pool);
    drop(q);
    pool.drain();
    check_no_leak(&shared, &[]).unwrap();
}

#[test]
fn a_starved_fill_ring_is_counted_and_nothing_leaks() {
    if !env_ready("a_starved_fill_ring_is_counted_and_nothing_leaks") {
        return;
    }
    let lab = Lab::new(1, 1);
    let (umem, shared) = pool_for(100);
    let reg = UmemRegistration::new(umem);
    let mut port = open(&lab.sw.0, PortSpec { iface: "sw0".into(), overrides: small_rings() }, &reg).unwrap();
    let (_, mut q) = port.take_queues().pop().unwrap();
    let mut pool = PoolCache::new(shared.clone(), 16, AllocMode::Recycling);
    q.rx_burst(&mut pool, &mut [Desc::default(); 64]);
    assert_eq!(q.frames_held(), 100, "every frame of the pool went to the 256-entry fill ring");
    assert!(q.stats().fill_starved.get() >= 1);
    q.release_all(&mut pool);
    drop(q);
    pool.drain();
    check_no_leak(&shared, &[]).unwrap();
    assert_eq!(port.xdp_stats()[0].1, None, "socket closed after release");
}

#[test]
fn a_veth_peers_drops_are_read_across_namespaces() {
    if !env_ready("a_veth_peers_drops_are_read_across_namespaces") {
        return;
    }
    use wasmswitch_afxdp::sys::veth_peer_tx_dropped;
    use wasmswitch_sys::ifindex;
    let lab = Lab::new(1, 1);
    let (sw, peer) = (lab.sw.0.clone(), lab.peers[0].0.clone());
    // The peer's MTU above this end's: veth drops (and counts on the peer) what this end's MTU
    // cannot take, the one cause of a peer drop a test can make at will.
    must(&["-n", &peer, "link", "set", "pe0", "mtu", "9000"]);
    let tx_dropped = |ns: &str, dev: &str| -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat", &format!("/sys/class/net/{dev}/statistics/tx_dropped")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let read = |dev: &'static str| in_netns(&sw, move || veth_peer_tx_dropped(ifindex(dev).expect(dev)));
    let before = read("sw0").unwrap().expect("sw0 is a veth");
    let tx = Packet::open(&peer, "pe0");
    let big = udp4_frame(M1, M0, [10, 0, 0, 1], [10, 0, 0, 2], 1000, 7777, 3000);
    for _ in 0..5 {
        // SAFETY: sends `big.len()` bytes from `big`. The send answers ENOBUFS: with the qdisc
        // bypassed, the veth's drop comes back to the sender.
        unsafe { libc::send(tx.fd.as_raw_fd(), big.as_ptr().cast(), big.len(), 0) };
    }
    let after = read("sw0").unwrap().expect("sw0 is a veth");
    assert_eq!(after, tx_dropped(&peer, "pe0"), "the peer's own counter, read from its namespace");
    assert!(after >= before + 5, "five oversize frames dropped by the peer: {before} -> {after}");
    // A peer in the same namespace (no IFLA_LINK_NETNSID), and an interface that is no veth.
    must(&["-n", &sw, "link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    assert_eq!(read("va").unwrap(), Some(tx_dropped(&sw, "vb")));
    assert_eq!(read("lo").unwrap(), None, "lo has no peer");
}

const CHILD_ENV: &str = "WSX_AFXDP_CHILD_NS";

/// Not a test on its own: the body of the child process of `sigkill_leaves_no_program_behind`.
/// With `WSX_AFXDP_CHILD_GENERIC` it attaches in generic mode; with `WSX_AFXDP_CHILD_EXIT` it
/// closes the port and exits once attached.
#[test]
fn sigkill_child_body() {
    let Ok(ns) = std::env::var(CHILD_ENV) else { return };
    let (umem, _shared) = pool_for(1024);
    let reg = UmemRegistration::new(umem);
    let mut overrides = small_rings();
    if std::env::var_os("WSX_AFXDP_CHILD_GENERIC").is_some() {
        overrides.attach = Some(wasmswitch_afxdp::AttachMode::Generic);
    }
    // A queue stays bound a moment after its last owner was killed (the daemon retries too).
    let t = std::time::Instant::now();
    let port = loop {
        match open(&ns, PortSpec { iface: "sw0".into(), overrides: overrides.clone() }, &reg) {
            Err(AfXdpError::QueueBusy { .. }) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => break r.unwrap(),
        }
    };
    println!("WSX-READY");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    if std::env::var_os("WSX_AFXDP_CHILD_EXIT").is_some() {
        // Closed in the port's namespace, as the daemon (wholly in it) does.
        in_netns(&ns, move || drop(port));
        return;
    }
    std::thread::sleep(Duration::from_secs(30));
}

/// The child of `sigkill_child_body` attached to the lab's `sw0`, once it says so.
fn attached_child(lab: &Lab, env: &[(&str, &str)]) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sigkill_child_body", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &lab.sw.0)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.any(|l| l.map(|l| l.contains("WSX-READY")).unwrap_or(false));
    assert!(ready, "child never attached");
    // Whatever it prints after, read: a closed pipe would fail its exit.
    std::thread::spawn(move || lines.for_each(drop));
    child
}

#[test]
fn gro_a_killed_generic_attach_left_off_is_restored_by_the_next() {
    if !env_ready("gro_a_killed_generic_attach_left_off_is_restored_by_the_next") {
        return;
    }
    let lab = Lab::new(1, 1);
    let gro = || {
        let out = must(&["netns", "exec", &lab.sw.0, "ethtool", "-k", "sw0"]);
        out.lines().any(|l| l.trim() == "generic-receive-offload: on")
    };
    must(&["netns", "exec", &lab.sw.0, "ethtool", "-K", "sw0", "gro", "on"]);
    assert!(gro());
    let state = std::env::temp_dir().join(format!("wsx-state-{}", std::process::id()));
    let state_s = state.to_str().unwrap();
    let generic = [("WSX_AFXDP_CHILD_GENERIC", "1"), ("WASMSWITCH_STATE_DIR", state_s)];
    let mut child = attached_child(&lab, &generic);
    assert!(!gro(), "off while attached in generic mode");
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(!gro(), "a SIGKILLed daemon cannot restore it");
    let notes: Vec<_> =
        std::fs::read_dir(&state).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert_eq!(notes.len(), 1, "the killed one's note of GRO/LRO: {notes:?} in {state_s}");
    // The next attach finds the note, and its clean exit restores what the first one found.
    let mut env = generic.to_vec();
    env.push(("WSX_AFXDP_CHILD_EXIT", "1"));
    let mut child = attached_child(&lab, &env);
    assert!(child.wait().unwrap().success());
    assert!(gro(), "restored to what the killed one found");
    assert_eq!(std::fs::read_dir(&state).map(|d| d.count()).unwrap_or(0), 0, "the note is gone");
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn sigkill_leaves_no_program_behind() {
    if !env_ready("sigkill_leaves_no_program_behind") {
        return;
    }
    let lab = Lab::new(1, 1);
    let mut child = attached_child(&lab, &[]);
    assert!(lab.xdp_shown("sw0"), "child's program is attached");
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(lab.xdp_gone("sw0"), "the bpf_link died with the process");
}
