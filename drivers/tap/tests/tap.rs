//! TAP end-to-end tests: a uniquely named TAP per test, frames checked with AF_PACKET sockets
//! bound to it.
//!
//! Without root or /dev/net/tun the tests print why and pass, unless `CI=true`, where they fail.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmswitch_testkit::env::Need;

use wasmswitch_core::pool::{check_no_leak, AllocMode};
use wasmswitch_core::{BulkReturn, Desc, PoolCache, PortQueue, SharedPool, Umem};
use wasmswitch_tap::{check_free, parse_mac, HostConfig, HostPort, TapConfig, TapDevice, TapError, UringOptions};

const ETHERTYPE: [u8; 2] = [0x88, 0xb5]; // local experimental: nothing else on the link uses it
const TAP_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];

/// True when the test can run (see [`wasmswitch_testkit::env::ready`]).
fn env_ready(test: &str) -> bool {
    wasmswitch_testkit::env::ready(test, &[Need::Root, Need::Tun])
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique_name() -> String {
    format!("wst{}x{}", std::process::id() % 1_000_000, SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Creates a TAP with IPv6 off (no autoconf chatter on the link).
fn make_tap(name: &str, queues: usize) -> TapDevice {
    let tap = TapDevice::create(&TapConfig { name: name.into(), mac: TAP_MAC, mtu: 1500, queues }).expect("create TAP");
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1");
    tap
}

fn pool(frames: u32) -> Arc<SharedPool> {
    SharedPool::new(wasmswitch_core::pool::PoolId(0), Arc::new(Umem::new(frames, 2048).unwrap()), 256)
}

/// An AF_PACKET socket bound to `ifindex` (all protocols).
fn packet_socket(ifindex: u32) -> OwnedFd {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); checked below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as i32) };
    assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
    // SAFETY: just created, owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: binds to a valid sockaddr_ll of the right size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(r, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
    let big: libc::c_int = 8 << 20;
    // SAFETY: sets an int option from a live value (root may exceed rmem_max with FORCE).
    unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&big as *const libc::c_int).cast(), 4)
    };
    let tv = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
    // SAFETY: sets a timeval option from a live value.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    fd
}

/// Receives one incoming (not outgoing) frame, or None after the socket timeout.
fn recv_incoming(fd: &OwnedFd) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: sockaddr_ll is plain data.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut sl = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: receives into our live buffer and address.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut sll as *mut libc::sockaddr_ll).cast(),
                &mut sl,
            )
        };
        if n < 0 {
            return None;
        }
        if sll.sll_pkttype == libc::PACKET_OUTGOING {
            continue;
        }
        return Some(buf[..n as usize].to_vec());
    }
}

fn send_on(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: sends from a live buffer on a bound packet socket.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(n as usize, frame.len(), "send: {}", std::io::Error::last_os_error());
}

fn test_frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0x02, 0xaa, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0xbb, 0, 0, 0, 3]);
    f[12..14].copy_from_slice(&ETHERTYPE);
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (seq as usize + i) as u8;
    }
    f
}

fn seq_of(f: &[u8]) -> Option<u32> {
    (f.len() >= 18 && f[12..14] == ETHERTYPE).then(|| u32::from_be_bytes(f[14..18].try_into().unwrap()))
}

fn cfg(bulk: usize, uring: UringOptions) -> HostConfig {
    HostConfig { datapath_workers: 1, host_workers: 1, bulk, uring, manage_link: false, ..HostConfig::default() }
}

fn start(name: &str, pool: &Arc<SharedPool>, cfg: &HostConfig) -> (HostPort, Vec<wasmswitch_tap::HostPortQueue>) {
    let tap = make_tap(name, cfg.host_workers);
    let (host, queues) = HostPort::start(tap, pool, cfg).expect("start host port");
    host.tap().set_up(true).unwrap();
    (host, queues)
}

fn wait_gone(name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if wasmswitch_sys::ifindex(name).is_none() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The host port's totals once `done` holds, or after 5 s (the caller's assertions then say
/// what was missing). Counters another thread updates are polled, never read just once.
fn totals_when(host: &HostPort, done: impl Fn(&wasmswitch_tap::TapTotals) -> bool) -> wasmswitch_tap::TapTotals {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let t = host.stats().totals();
        if done(&t) || Instant::now() >= deadline {
            return t;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn deliver_and_read_back(uring: UringOptions, bulk: usize) {
    let name = unique_name();
    let pool = pool(1024);
    let (mut host, mut queues) = start(&name, &pool, &cfg(bulk, uring));
    let sock = packet_socket(host.tap().ifindex());
    let mut q = queues.remove(0);
    let mut cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let umem = pool.umem().clone();
    const N: u32 = 300;
    let mut seq = 0;
    while seq < N {
        // Bursts of 13: not a multiple of the bulk, so both flush paths run.
        let mut burst = Vec::new();
        for _ in 0..13.min(N - seq) {
            let a = cache.alloc().unwrap() + 64;
            let f = test_frame(seq, 60 + (seq as usize % 200));
            // SAFETY: the frame was just allocated to this test.
            unsafe { umem.bytes_mut(a, f.len()) }.copy_from_slice(&f);
            burst.push(Desc { addr: a, len: f.len() as u32, options: 0 });
            seq += 1;
        }
        assert_eq!(q.tx_burst(&burst), burst.len());
        q.flush_tx();
    }
    let mut got = 0;
    while let Some(f) = recv_incoming(&sock) {
        let Some(s) = seq_of(&f) else { continue };
        assert_eq!(s, got, "frames arrive in order");
        assert_eq!(f, test_frame(s, 60 + (s as usize % 200)), "frame {s} content");
        got += 1;
        if got == N {
            break;
        }
    }
    assert_eq!(got, N, "every frame delivered");
    let mut bulk_ret = BulkReturn::new();
    q.complete(&mut cache, &mut bulk_ret);
    bulk_ret.flush(&mut cache);
    // The host worker counts a list after io_uring reports it written, so the frames can be
    // read here before the counter moves: wait for it (bounded) instead of reading it once.
    let lists = (N as u64).div_ceil(bulk as u64);
    let t = totals_when(&host, |t| t.delivered >= N as u64 && t.batch_hist.iter().sum::<u64>() >= lists);
    assert_eq!(t.delivered, N as u64);
    assert_eq!(t.ring_full, 0);
    assert_eq!(t.write_errors, 0);
    assert!(t.batch_hist.iter().sum::<u64>() >= lists);
    assert_eq!(t.batch_frames, N as u64, "the histogram's sum is the frames in its lists");
    let max_bucket = wasmswitch_tap::BATCH_BUCKETS.iter().position(|&b| b >= bulk).unwrap();
    assert!(t.batch_hist[max_bucket + 1..].iter().all(|&c| c == 0), "no list larger than the bulk: {:?}", t.batch_hist);
    eprintln!("features {:?}, totals {t:?}", host.features()[0]);
    q.release_all(&mut cache);
    drop(q);
    host.stop();
    cache.drain();
    check_no_leak(&pool, &[]).unwrap();
    drop(host);
    assert!(wait_gone(&name), "TAP {name} gone after the host port is dropped");
}

#[test]
fn host_port_delivers_to_tap_default_options() {
    if !env_ready("host_port_delivers_to_tap_default_options") {
        return;
    }
    deliver_and_read_back(UringOptions::default(), 8);
}

#[test]
fn host_port_delivers_to_tap_plain_ring_bulk_32() {
    if !env_ready("host_port_delivers_to_tap_plain_ring_bulk_32") {
        return;
    }
    deliver_and_read_back(UringOptions::plain(), 32);
}

#[test]
fn host_frames_come_in_through_rx_burst() {
    if !env_ready("host_frames_come_in_through_rx_burst") {
        return;
    }
    let name = unique_name();
    let pool = pool(1024);
    let (mut host, mut queues) = start(&name, &pool, &cfg(8, UringOptions::default()));
    let sock = packet_socket(host.tap().ifindex());
    let mut q = queues.remove(0);
    let mut cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let umem = pool.umem().clone();
    const N: u32 = 200;
    for s in 0..N {
        send_on(&sock, &test_frame(s, 60 + s as usize));
    }
    let mut got = 0;
    let mut out = [Desc::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(5);
    while got < N && Instant::now() < deadline {
        let n = q.rx_burst(&mut cache, &mut out);
        for d in &out[..n] {
            // SAFETY: rx_burst handed the frame to this test.
            let f = unsafe { umem.bytes(d.addr, d.len as usize) }.to_vec();
            if let Some(s) = seq_of(&f) {
                assert_eq!(s, got, "in order");
                assert_eq!(f, test_frame(s, 60 + s as usize));
                got += 1;
            }
            cache.put(d.addr);
        }
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(got, N);
    let t = host.stats().totals();
    assert!(t.tap_rx_packets >= N as u64 && t.rx_frames >= N as u64, "{t:?}");
    q.release_all(&mut cache);
    drop(q);
    host.stop();
    cache.drain();
    check_no_leak(&pool, &[]).unwrap();
}

#[test]
fn ring_full_flood_drops_counts_and_never_blocks() {
    if !env_ready("ring_full_flood_drops_counts_and_never_blocks") {
        return;
    }
    let name = unique_name();
    let pool = pool(2048);
    let c = HostConfig { ring_size: 8, ..cfg(8, UringOptions::default()) };
    let (mut host, mut queues) = start(&name, &pool, &c);
    let mut q = queues.remove(0);
    let mut cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
    let umem = pool.umem().clone();
    let start_t = Instant::now();
    let mut sent = 0u64;
    for round in 0..2000u32 {
        let mut burst = [Desc::default(); 64];
        let mut n = 0;
        for d in burst.iter_mut() {
            let Some(a) = cache.alloc() else { break };
            let f = test_frame(round, 64);
            // SAFETY: the frame was just allocated to this test.
            unsafe { umem.bytes_mut(a, 64) }.copy_from_slice(&f);
            *d = Desc { addr: a, len: 64, options: 0 };
            n += 1;
        }
        sent += q.tx_burst(&burst[..n]) as u64;
        q.flush_tx();
        let mut b = BulkReturn::new();
        q.complete(&mut cache, &mut b);
        b.flush(&mut cache);
    }
    let elapsed = start_t.elapsed();
    assert!(elapsed < Duration::from_secs(20), "the flood took {elapsed:?}: something blocked");
    q.release_all(&mut cache);
    drop(q);
    host.stop();
    let t = host.stats().totals();
    eprintln!("flood: sent {sent} in {elapsed:?}: {t:?}");
    assert!(t.ring_full > 0, "a ring of 8 must overflow under a flood: {t:?}");
    assert_eq!(t.enqueued, sent);
    assert_eq!(t.ring_enqueued + t.ring_full, sent, "every frame either entered the ring or was dropped at it");
    assert!(t.delivered + t.write_errors <= t.ring_enqueued);
    cache.drain();
    check_no_leak(&pool, &[]).unwrap();
}

#[test]
fn tap_gone_after_drop() {
    if !env_ready("tap_gone_after_drop") {
        return;
    }
    let name = unique_name();
    let tap = make_tap(&name, 2);
    assert!(wasmswitch_sys::ifindex(&name).is_some());
    assert_eq!(tap.mac(), TAP_MAC);
    let mac = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).unwrap();
    assert_eq!(mac.trim(), "02:00:00:00:00:01");
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).unwrap();
    assert_eq!(mtu.trim(), "1500");
    tap.set_up(true).unwrap();
    assert!(tap.is_up().unwrap());
    tap.set_up(false).unwrap();
    assert!(!tap.is_up().unwrap());
    drop(tap);
    assert!(wait_gone(&name));
}

/// Run as a child by `tap_gone_after_sigkill`: holds a TAP with running host workers.
#[test]
fn child_holds_tap() {
    let Ok(name) = std::env::var("WSTAP_CHILD") else { return };
    let pool = pool(256);
    let (_host, _queues) = start(&name, &pool, &cfg(8, UringOptions::default()));
    println!("READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn tap_gone_after_sigkill() {
    if !env_ready("tap_gone_after_sigkill") {
        return;
    }
    let name = unique_name();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_tap", "--nocapture", "--test-threads=1"])
        .env("WSTAP_CHILD", &name)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.any(|l| l.map(|l| l.contains("READY")).unwrap_or(false));
    assert!(ready, "child never got ready");
    assert!(wasmswitch_sys::ifindex(&name).is_some(), "child created {name}");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(wait_gone(&name), "TAP {name} gone after SIGKILL of its owner");
}

#[test]
fn clear_errors() {
    // No root needed for these: checked before any syscall.
    assert!(matches!(parse_mac("01:00:5e:00:00:01"), Err(TapError::BadMac { .. })));
    assert!(matches!(parse_mac("zz:00:00:00:00:01"), Err(TapError::BadMac { .. })));
    assert!(matches!(parse_mac("02:00:00:00:00"), Err(TapError::BadMac { .. })));
    assert_eq!(parse_mac("02:00:00:00:00:0a").unwrap(), [2, 0, 0, 0, 0, 10]);
    let e = TapDevice::create(&TapConfig::new("x", [0xff; 6])).unwrap_err();
    assert!(e.to_string().contains("unicast"), "{e}");
    let e = TapDevice::create(&TapConfig::new("a-name-that-is-too-long", TAP_MAC)).unwrap_err();
    assert!(matches!(e, TapError::BadName { .. }), "{e}");
    if !env_ready("clear_errors") {
        return;
    }
    let e = TapDevice::create(&TapConfig::new("lo", TAP_MAC)).unwrap_err();
    assert!(matches!(e, TapError::NameTaken { .. }), "{e}");
    let name = unique_name();
    let _tap = make_tap(&name, 1);
    // What `check` asks of `host.tap`: an existing TAP may be a running switch's own; any other
    // interface could never become the TAP.
    assert!(check_free(&name).is_ok());
    assert!(matches!(check_free("lo"), Err(TapError::NameTaken { .. })));
    assert!(check_free(&unique_name()).is_ok());
    let e = TapDevice::create(&TapConfig::new(&name, TAP_MAC)).unwrap_err();
    assert!(matches!(e, TapError::NameTaken { .. }), "{e}");
    assert!(e.to_string().contains("already taken"), "{e}");
    // A host port whose UMEM frames cannot hold the MTU is refused.
    let name2 = unique_name();
    let mut c = TapConfig::new(&name2, TAP_MAC);
    c.mtu = 9000;
    let tap = TapDevice::create(&c).unwrap();
    let e = HostPort::start(tap, &pool(64), &HostConfig::default()).unwrap_err();
    assert!(matches!(e, TapError::BadMtu { .. }), "{e}");
    assert!(wait_gone(&name2));
}
