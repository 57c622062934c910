//! `wasmswitch-gen`: an AF_XDP TX-only traffic generator for the veth benchmark.
//!
//! One UMEM of pre-built Ethernet/IPv4/UDP frames (valid IPv4 header checksums, so a Linux
//! bridge with `bridge-nf-call-iptables=1` forwards them), one AF_XDP socket bound in copy
//! mode to one queue of one interface, and a loop that posts batches of descriptors to the TX
//! ring, kicks the kernel with `sendto` when the ring asks for it (need_wakeup) and drains the
//! completion ring in bulk. No XDP program is attached: transmitting through AF_XDP needs
//! none, so the generator's interface stays free and cheap.
//!
//! The socket is built with the driver crate's public `xsk::open_socket` (the same code the
//! switch uses), without `AfXdpPort` (which always attaches the redirect program).
//!
//! Output: one JSON object on stdout, e.g.
//! `{"iface":"g0","duration_s":5.0,"target_pps":null,"sent":3500000,"offered_pps":700000.0,...}`
//! where `sent` counts descriptors posted inside the measured window that the kernel consumed
//! from the TX ring (each one handed to the interface's transmit; a frame the peer dropped on
//! arrival still counts as sent, it is the receiver's loss).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use wasmswitch_afxdp::profile::{BindMode, RingSizes};
use wasmswitch_afxdp::xsk::{self, UmemBinding};
use wasmswitch_core::wire::build::udp4_frame;
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::{Desc, Umem};

const FRAME_SIZE: u32 = 2048;

#[derive(Parser, Debug)]
#[command(version, about = "AF_XDP TX-only traffic generator (copy mode, pre-built UDP frames, no XDP program)")]
struct Args {
    /// Interface to transmit on (in the caller's network namespace).
    #[arg(long, required_unless_present = "tsc_hz")]
    iface: Option<String>,
    /// Queue id to bind to.
    #[arg(long, default_value_t = 0)]
    queue: u32,
    /// Source MAC of every frame.
    #[arg(long, default_value = "02:00:00:00:00:01")]
    src_mac: String,
    /// Destination MAC of every frame.
    #[arg(long, default_value = "02:00:00:00:00:02")]
    dst_mac: String,
    /// Source IPv4 address (flows vary the UDP source port).
    #[arg(long, default_value = "10.99.0.1")]
    src_ip: std::net::Ipv4Addr,
    #[arg(long, default_value = "10.99.0.2")]
    dst_ip: std::net::Ipv4Addr,
    /// Distinct flows (UDP source ports 10000..10000+flows).
    #[arg(long, default_value_t = 64)]
    flows: u32,
    /// Frame length in bytes without FCS (at least 60).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Packets per second, or `max`.
    #[arg(long, default_value = "max")]
    rate: String,
    /// Seconds to transmit for.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many packets (priming a switch's MAC table); overrides nothing else.
    #[arg(long)]
    count: Option<u64>,
    /// CPU to pin the generator to.
    #[arg(long)]
    cpu: Option<usize>,
    /// Descriptors posted per TX-ring write.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// With --rate: packets that must be due before a post (paced bursts; 1 = smooth pacing).
    #[arg(long, default_value_t = 32)]
    burst: usize,
    /// TX and completion ring entries (power of two).
    #[arg(long, default_value_t = 2048)]
    ring: u32,
    /// Print the TSC frequency in Hz (measured over 200 ms) as JSON and exit.
    #[arg(long)]
    tsc_hz: bool,
}

fn tsc_hz() -> f64 {
    let t0 = Instant::now();
    let c0 = wasmswitch_core::counter::cycles();
    std::thread::sleep(Duration::from_millis(200));
    let c1 = wasmswitch_core::counter::cycles();
    (c1.wrapping_sub(c0)) as f64 / t0.elapsed().as_secs_f64()
}

/// One frame per flow, UDP source port `10000 + flow`.
fn templates(a: &Args) -> Result<Vec<Vec<u8>>> {
    let dst: MacAddr = a.dst_mac.parse().map_err(anyhow::Error::msg)?;
    let src: MacAddr = a.src_mac.parse().map_err(anyhow::Error::msg)?;
    if !(60..=1514).contains(&a.size) {
        bail!("--size {} out of range 60..=1514", a.size);
    }
    if a.flows == 0 || a.flows > 50_000 {
        bail!("--flows must be 1..=50000");
    }
    Ok((0..a.flows)
        .map(|f| udp4_frame(dst, src, a.src_ip.octets(), a.dst_ip.octets(), 10000 + f as u16, 9, a.size))
        .collect())
}

#[derive(Default, Debug)]
struct Counts {
    posted: u64,
    completed: u64,
    kicks: u64,
    kick_busy: u64,
    kick_errors: u64,
}

fn kick(fd: i32, c: &mut Counts) {
    c.kicks += 1;
    // SAFETY: zero-length sendto with null buffer and address on our own AF_XDP socket: the
    // kernel reads no userspace memory, it only processes the TX ring.
    let r = unsafe { libc::sendto(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
    if r < 0 {
        match std::io::Error::last_os_error().raw_os_error() {
            // EAGAIN: the kernel stopped after its per-call budget (32 in copy mode) or the
            // device queue is busy; EBUSY: a frame was dropped by the device (completed, not
            // sent); ENOBUFS: no skb. All mean "call again".
            Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) => c.kick_busy += 1,
            _ => c.kick_errors += 1,
        }
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.tsc_hz {
        println!("{}", serde_json::json!({ "tsc_hz": tsc_hz() }));
        return Ok(());
    }
    let iface = a.iface.clone().expect("clap requires --iface");
    let rate: Option<f64> = match a.rate.as_str() {
        "max" | "0" => None,
        r => Some(r.parse::<f64>().with_context(|| format!("--rate `{r}`: packets per second or `max`"))?),
    };
    if !a.ring.is_power_of_two() || a.ring < 64 {
        bail!("--ring must be a power of two >= 64");
    }
    let batch = a.batch.clamp(1, 256);
    let burst_min = a.burst.clamp(1, batch);
    if let Some(cpu) = a.cpu {
        wasmswitch_sys::pin_to_cpu(cpu).with_context(|| format!("pinning to CPU {cpu}"))?;
    }
    let tmpl = templates(&a)?;

    // Enough frames to keep the TX ring full while completions trail behind.
    let frames = (a.ring * 2).max(tmpl.len() as u32);
    let umem = Umem::new(frames, FRAME_SIZE).context("mapping the UMEM")?;
    let mut free: Vec<u64> = Vec::with_capacity(frames as usize);
    let mut len_of = vec![0u32; frames as usize];
    for i in 0..frames {
        let f = &tmpl[i as usize % tmpl.len()];
        let addr = i as u64 * FRAME_SIZE as u64;
        // SAFETY: the UMEM was just mapped and no socket exists yet: this thread is the only
        // holder of every frame.
        unsafe { umem.bytes_mut(addr, f.len()) }.copy_from_slice(f);
        len_of[i as usize] = f.len() as u32;
        free.push(addr);
    }
    // Interleave flows in ring order (frame i carries flow i % flows; pop from the end).
    free.reverse();

    let ifindex =
        wasmswitch_sys::ifindex(&iface).with_context(|| format!("no interface `{iface}` in this namespace"))?;
    // RX and fill rings are required by the socket layout but stay unused (no program redirects
    // anything to this socket).
    let rings = RingSizes { rx: 64, fill: 64, tx: a.ring, completion: a.ring };
    // A socket of the previous run on this queue is released asynchronously after its process
    // exits; bind answers EBUSY until then, so retry for a while.
    let mut tries = 0;
    let mut s = loop {
        match xsk::open_socket(&umem, &iface, ifindex, a.queue, rings, UmemBinding::Register(BindMode::Copy)) {
            Ok(s) => break s,
            Err(xsk::SetupError::Bind(e)) if e.raw_os_error() == Some(libc::EBUSY) && tries < 60 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => bail!("opening the AF_XDP socket on {iface} queue {}: {e:?}", a.queue),
        }
    };
    let fd = s.handle.raw();

    let mut c = Counts::default();
    let mut descs = vec![Desc::default(); batch];
    let mut comp = vec![0u64; a.ring as usize];
    let limit = a.count.unwrap_or(u64::MAX);
    let dur = Duration::from_secs_f64(a.duration);
    let start = Instant::now();
    let mut elapsed;
    loop {
        let n = s.tx.comp.consume(&mut comp);
        if n > 0 {
            c.completed += n as u64;
            free.extend_from_slice(&comp[..n]);
        }
        elapsed = start.elapsed();
        if elapsed >= dur || c.posted >= limit {
            break;
        }
        let mut want = batch.min(free.len()).min((limit - c.posted) as usize);
        if let Some(r) = rate {
            let due = ((r * elapsed.as_secs_f64()) as u64).min(limit).saturating_sub(c.posted) as usize;
            // Paced in bursts: post once `burst` packets are due, so the receiver sees bursts
            // of a realistic size instead of one packet per kick.
            want = if due >= burst_min { want.min(due) } else { 0 };
        }
        if want > 0 {
            for d in descs[..want].iter_mut() {
                let addr = free.pop().expect("want <= free.len()");
                *d = Desc { addr, len: len_of[(addr / FRAME_SIZE as u64) as usize], options: 0 };
            }
            let k = s.tx.tx.produce(&descs[..want]);
            for d in descs[k..want].iter().rev() {
                free.push(d.addr);
            }
            c.posted += k as u64;
        }
        if s.tx.tx.needs_wakeup() && s.tx.tx.outstanding() > 0 {
            kick(fd, &mut c);
        }
    }
    let window = elapsed.as_secs_f64();
    // Let the tail complete so the UMEM is not torn down under in-flight frames (the socket
    // close would handle it anyway).
    let drain_until = Instant::now() + Duration::from_millis(200);
    while c.completed < c.posted && Instant::now() < drain_until {
        if s.tx.tx.outstanding() > 0 {
            kick(fd, &mut c);
        }
        c.completed += s.tx.comp.consume(&mut comp) as u64;
    }
    // Descriptors the kernel consumed (transmitted, or dropped by the device): everything posted
    // inside the window, minus what it never took. The tail goes out just after the window ends,
    // so the receiver's count (read a little later) includes it too.
    let sent = c.posted - s.tx.tx.outstanding() as u64;
    let st = s.handle.statistics().ok();
    let out = serde_json::json!({
        "iface": iface,
        "queue": a.queue,
        "cpu": a.cpu,
        "duration_s": window,
        "target_pps": rate,
        "frame_len": a.size,
        "flows": a.flows,
        "batch": batch,
        "burst": burst_min,
        "sent": sent,
        "offered_pps": sent as f64 / window,
        "posted": c.posted,
        "completed": c.completed,
        "kicks": c.kicks,
        "kick_busy": c.kick_busy,
        "kick_errors": c.kick_errors,
        "tx_invalid_descs": st.map(|s| s.tx_invalid_descs),
    });
    println!("{out}");
    Ok(())
}
