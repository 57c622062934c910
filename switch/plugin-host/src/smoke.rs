//! The smoke run of `wasmswitch check`: a fresh instance of a compiled plugin classifies a
//! fixed set of built-in frames, one of each kind a plugin meets on a real network, under the
//! plugin's own deadline and memory limit. A plugin that panics on an ARP request or spins on
//! a fragment then fails `check`, naming the frame, instead of faulting on its first batch in
//! production.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use wasmswitch_core::batch::Desc;
use wasmswitch_core::verdict::{BatchView, Verdict};
use wasmswitch_core::wire::build::{ethernet_frame, insert_vlan, ipv4_frame, l4_frame, tcp_flags, IpPair, L4};
use wasmswitch_core::wire::checksum::checksum;
use wasmswitch_core::wire::{self, ethertype, ipproto, MacAddr, PacketMeta};
use wasmswitch_core::{PortId, Umem, BATCH_SIZE, DEFAULT_BATCH};

use crate::codec::encode_batch;
use crate::deadline::{deadline_ticks, thread_cpu_time, CpuWatch, INIT_DEADLINE};
use crate::sandbox::LogGate;
use crate::spec::{err, ErrorKind, PluginError};
use crate::stage::PluginFactory;
use crate::stats::{FaultReason, PluginStats};

/// One built-in frame and what it is (the name errors and reports use).
#[derive(Clone, Debug)]
pub struct SmokeFrame {
    /// What the frame is, as errors and reports name it (`IPv4 TCP SYN`).
    pub what: &'static str,
    /// The Ethernet frame, destination MAC first, without FCS.
    pub bytes: Vec<u8>,
}

const A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
const B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);
const V4: IpPair = IpPair::V4([10, 0, 0, 1], [10, 0, 0, 2]);
const V6: IpPair = IpPair::V6(
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
);

/// The frames of the smoke run, every one accepted by the switch's parser (the switch drops
/// runts and malformed headers before any plugin sees them, so those are not here).
pub fn smoke_frames() -> Vec<SmokeFrame> {
    let mut arp = vec![0, 1, 0x08, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&A.0);
    arp.extend_from_slice(&[10, 0, 0, 1]);
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&[10, 0, 0, 2]);
    let mut echo = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    echo.extend((0..56u8).map(|i| i.wrapping_add(0x10)));
    let c = checksum(&echo);
    echo[2..4].copy_from_slice(&c.to_be_bytes());
    let mut tagged = l4_frame(B, A, V4, L4::Udp, 40000, 53, 64);
    insert_vlan(&mut tagged, 100);
    // A second fragment: IP says "offset 185 (1480 bytes)", so there is no L4 header.
    let mut fragment = ipv4_frame(B, A, [10, 0, 0, 1], [10, 0, 0, 2], ipproto::TCP, &[0x5a; 40]);
    fragment[20..22].copy_from_slice(&185u16.to_be_bytes());
    fragment[24..26].fill(0);
    let c = checksum(&fragment[14..34]);
    fragment[24..26].copy_from_slice(&c.to_be_bytes());
    let mdns = MacAddr([0x01, 0, 0x5e, 0, 0, 0xfb]);
    vec![
        SmokeFrame { what: "ARP request", bytes: ethernet_frame(MacAddr::BROADCAST, A, ethertype::ARP, &arp) },
        SmokeFrame { what: "IPv4 UDP", bytes: l4_frame(B, A, V4, L4::Udp, 40000, 53, 80) },
        SmokeFrame { what: "IPv4 TCP SYN", bytes: l4_frame(B, A, V4, L4::Tcp(tcp_flags::SYN), 40000, 80, 66) },
        SmokeFrame {
            what: "IPv4 TCP SYN-ACK",
            bytes: l4_frame(
                A,
                B,
                IpPair::V4([10, 0, 0, 2], [10, 0, 0, 1]),
                L4::Tcp(tcp_flags::SYN | tcp_flags::ACK),
                80,
                40000,
                66,
            ),
        },
        SmokeFrame {
            what: "IPv4 ICMP echo request",
            bytes: ipv4_frame(B, A, [10, 0, 0, 1], [10, 0, 0, 2], ipproto::ICMP, &echo),
        },
        SmokeFrame { what: "IPv6 UDP", bytes: l4_frame(B, A, V6, L4::Udp, 40000, 53, 100) },
        SmokeFrame {
            what: "IPv6 TCP",
            bytes: l4_frame(B, A, V6, L4::Tcp(tcp_flags::ACK | tcp_flags::PSH), 40000, 443, 120),
        },
        SmokeFrame { what: "802.1Q-tagged IPv4 UDP (VLAN 100)", bytes: tagged },
        SmokeFrame {
            what: "broadcast IPv4 UDP",
            bytes: l4_frame(MacAddr::BROADCAST, A, IpPair::V4([0; 4], [255; 4]), L4::Udp, 68, 67, 342),
        },
        SmokeFrame {
            what: "multicast IPv4 UDP",
            bytes: l4_frame(mdns, A, IpPair::V4([10, 0, 0, 1], [224, 0, 0, 251]), L4::Udp, 5353, 5353, 90),
        },
        SmokeFrame { what: "minimum-size frame (60 bytes, IPv4 UDP)", bytes: l4_frame(B, A, V4, L4::Udp, 1, 2, 60) },
        // What reaches a plugin with its L4 header cut short: the parser checks the TCP and
        // UDP headers (a cut one is dropped), but not those of other protocols. The frame ends
        // 4 bytes into the ICMP header, as a veth delivers it (no padding to 60).
        SmokeFrame {
            what: "IPv4 ICMP with a truncated L4 header",
            bytes: ipv4_frame(B, A, [10, 0, 0, 1], [10, 0, 0, 2], ipproto::ICMP, &echo[..4]),
        },
        SmokeFrame { what: "IPv4 TCP fragment without L4 header", bytes: fragment },
        SmokeFrame {
            what: "full-size frame (1514 bytes, IPv4 TCP)",
            bytes: l4_frame(B, A, V4, L4::Tcp(tcp_flags::ACK), 40000, 80, 1514),
        },
        SmokeFrame {
            what: "non-IP ethertype 0x88b5",
            bytes: ethernet_frame(B, A, 0x88b5, b"wasmswitch smoke test, local experimental ethertype"),
        },
    ]
}

/// What a plugin answered in its smoke run: the kinds of verdicts it gave the frames (one
/// each, from the batches of one), every redirect it asked for in any batch, and how much of
/// its deadline its costliest full batch used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmokeReport {
    /// Built-in frames run (the length of [`smoke_frames`]).
    pub frames: usize,
    /// Frames the plugin passed (each counted once, by its verdict alone in a batch).
    pub pass: usize,
    /// Frames it dropped.
    pub drop: usize,
    /// Frames it redirected to a port.
    pub redirect: usize,
    /// Frames it sent to the host instead of forwarding.
    pub host: usize,
    /// Frames it forwarded and also copied to the host.
    pub host_copy: usize,
    /// (frame, port) for each frame redirected: the caller knows which ports exist.
    pub redirects: Vec<(&'static str, PortId)>,
    /// The full-size batch (`switch.batch` packets) that took the most CPU time.
    pub slowest: SlowestBatch,
    /// The plugin's `deadline_us`.
    pub deadline: Duration,
    /// The CPU time a call always gets before its deadline fires: the deadline rounded up to
    /// whole epoch ticks (at least one), see [`crate::deadline_as_enforced`].
    pub allowed: Duration,
}

/// The costliest full-size batch of a smoke run: which one, and its CPU time (the least of
/// three calls of it, so a first call's page faults or a busy moment do not count).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlowestBatch {
    /// The batch as errors name it (``frame `IPv4 UDP` (batch of 64 copies)``).
    pub what: String,
    /// Its CPU time: the least of its three calls.
    pub cpu: Duration,
}

/// Share of its deadline a plugin's costliest smoke batch may use before `check` warns: the
/// built-in frames are not the traffic it will meet (more rules may match, its memory will be
/// colder), and a busy core runs the same code slower.
pub const NEAR_DEADLINE: f64 = 0.5;

impl SmokeReport {
    /// `slowest batch: frame `IPv4 UDP` (batch of 64 copies), 41 µs of CPU, 1 % of deadline_us
    /// 5000`, and where the deadline is enforced as longer than set, as what.
    pub fn timing(&self) -> String {
        let of = if self.allowed == self.deadline {
            format!("deadline_us {}", self.deadline.as_micros())
        } else {
            format!(
                "its deadline (deadline_us {}, enforced in whole epoch ticks: {} µs)",
                self.deadline.as_micros(),
                self.allowed.as_micros()
            )
        };
        format!(
            "slowest batch: {}, {} µs of CPU, {:.0} % of {of}",
            self.slowest.what,
            self.slowest.cpu.as_micros(),
            self.deadline_share() * 100.0,
        )
    }

    /// The slowest batch's CPU time as a share of the time a call always gets.
    pub fn deadline_share(&self) -> f64 {
        self.slowest.cpu.as_secs_f64() / self.allowed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// A warning when the slowest batch used [`NEAR_DEADLINE`] of its deadline or more.
    pub fn near_deadline(&self) -> Option<String> {
        (self.deadline_share() >= NEAR_DEADLINE).then(|| {
            format!(
                "its {}: real traffic may run past the deadline and fault (raise deadline_us, or lower switch.batch: the deadline is per batch)",
                self.timing()
            )
        })
    }
}

impl fmt::Display for SmokeReport {
    /// `ok on 15 frames (pass 13, drop 2)`: the kinds that occurred.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ok on {} frames (", self.frames)?;
        let kinds = [
            ("pass", self.pass),
            ("drop", self.drop),
            ("redirect", self.redirect),
            ("host", self.host),
            ("host-copy", self.host_copy),
        ];
        let shown: Vec<String> = kinds.iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k} {n}")).collect();
        write!(f, "{})", shown.join(", "))
    }
}

/// The built-in frames in one UMEM (one frame slot each) with the metadata the switch's
/// parser gives them.
struct Frames {
    umem: Umem,
    descs: Vec<Desc>,
    meta: Vec<PacketMeta>,
    what: Vec<&'static str>,
}

impl Frames {
    fn new(frames: &[SmokeFrame]) -> Result<Self, String> {
        const SLOT: u32 = 2048;
        let umem = Umem::new(frames.len() as u32, SLOT).map_err(|e| format!("smoke run: frame memory: {e}"))?;
        let (mut descs, mut meta) = (Vec::new(), Vec::new());
        for (i, f) in frames.iter().enumerate() {
            let addr = i as u64 * SLOT as u64;
            if !umem.in_bounds(addr, f.bytes.len()) {
                return Err(format!("smoke run: frame `{}` does not fit a frame slot", f.what));
            }
            // SAFETY: this function owns the whole UMEM; frame i lives alone in slot i.
            unsafe { umem.bytes_mut(addr, f.bytes.len()) }.copy_from_slice(&f.bytes);
            descs.push(Desc { addr, len: f.bytes.len() as u32, options: 0 });
            let m = wire::parse(&f.bytes, usize::MAX)
                .map_err(|e| format!("smoke run: built-in frame `{}` does not parse: {e:?}", f.what))?;
            meta.push(m);
        }
        Ok(Self { umem, descs, meta, what: frames.iter().map(|f| f.what).collect() })
    }
}

impl PluginFactory {
    /// [`PluginFactory::smoke_batch`] with batches of [`DEFAULT_BATCH`] packets.
    pub fn smoke(&self, in_port: PortId) -> Result<SmokeReport, PluginError> {
        self.smoke_batch(in_port, DEFAULT_BATCH)
    }

    /// The smoke run (`wasmswitch check`): a fresh instance, made as a worker's would be,
    /// classifies each of [`smoke_frames`] alone and in a batch of `batch` copies (the
    /// switch's `switch.batch`, clamped to 1..=[`BATCH_SIZE`]), then all of them mixed in one
    /// such batch, as packets of port `in_port`. Each call runs
    /// under the plugin's deadline and memory limit. The first fault (trap or panic, deadline,
    /// memory, malformed verdicts) is an error of kind [`ErrorKind::Smoke`] in one line:
    /// which frame, which batch, why.
    pub fn smoke_batch(&self, in_port: PortId, batch: usize) -> Result<SmokeReport, PluginError> {
        let batch = batch.clamp(1, BATCH_SIZE);
        let spec = &self.spec;
        let frames = Frames::new(&smoke_frames()).map_err(|m| err(spec, ErrorKind::Smoke, m))?;
        let stats = Arc::new(PluginStats::default());
        let mut live =
            self.new_instance(usize::MAX, spec.label().into(), stats.clone(), &mut LogGate::new(), INIT_DEADLINE)?;
        let ticks = deadline_ticks(spec.deadline, self.engine.opts.epoch_tick);
        let allowed = self.engine.opts.epoch_tick * (ticks - 1) as u32;
        let mut report =
            SmokeReport { frames: frames.descs.len(), deadline: spec.deadline, allowed, ..Default::default() };
        // The costliest full-size batch so far: (CPU time, index into `batches`). Each full-size
        // batch runs three times and counts its least CPU time.
        let mut slowest: Option<(Duration, usize)> = None;
        let (mut buf, mut verdicts) = (Vec::new(), Vec::new());
        let n = frames.descs.len();
        // (frame indices, what the batch is called in an error, whether it is one frame alone)
        let mut batches: Vec<(Vec<usize>, String, bool)> = Vec::new();
        for i in 0..n {
            batches.push((vec![i], format!("frame `{}` (batch of 1)", frames.what[i]), true));
            // At a batch of one, the batch of copies is the frame alone again.
            if batch > 1 {
                batches.push((vec![i; batch], format!("frame `{}` (batch of {batch} copies)", frames.what[i]), false));
            }
        }
        batches.push(((0..batch).map(|k| k % n).collect(), format!("a batch of {batch} mixed frames"), false));
        // One call of batch `idx`: its CPU time, or the fault in one line.
        let mut call = |idx: &[usize], what: &str, verdicts: &mut Vec<Verdict>| -> Result<Duration, PluginError> {
            let descs: Vec<Desc> = idx.iter().map(|&i| frames.descs[i]).collect();
            let meta: Vec<PacketMeta> = idx.iter().map(|&i| frames.meta[i]).collect();
            let view = BatchView { in_port, queue: 0, umem: &frames.umem, descs: &descs, meta: &meta };
            encode_batch(&view, spec.header_bytes as usize, &mut buf);
            verdicts.clear();
            verdicts.resize(idx.len(), Verdict::Pass);
            // Every check call is measured in CPU time too: nothing here is per packet.
            let watch = Some(CpuWatch::start(self.engine.opts.epoch_tick * ticks as u32));
            let start = thread_cpu_time();
            if let Err((reason, why)) = live.process(ticks, &buf, verdicts, &stats, watch) {
                let limit = match reason {
                    FaultReason::Deadline => format!(" (deadline_us {})", spec.deadline.as_micros()),
                    _ => String::new(),
                };
                return Err(err(
                    spec,
                    ErrorKind::Smoke,
                    format!("smoke run: {} on {what}: {why}{limit}", reason.as_str()),
                ));
            }
            Ok(thread_cpu_time().saturating_sub(start))
        };
        for (k, (idx, what, alone)) in batches.iter().enumerate() {
            let first = call(idx, what, &mut verdicts)?;
            // What the report says a plugin answered is what its first call of the batch did.
            for (&i, v) in idx.iter().zip(&verdicts) {
                if let Verdict::Redirect(port) = *v {
                    if !report.redirects.contains(&(frames.what[i], port)) {
                        report.redirects.push((frames.what[i], port));
                    }
                }
            }
            // One verdict per frame: from the batch of the frame alone.
            if *alone {
                match verdicts[0] {
                    Verdict::Pass => report.pass += 1,
                    Verdict::Drop => report.drop += 1,
                    Verdict::Redirect(_) => report.redirect += 1,
                    Verdict::Host => report.host += 1,
                    Verdict::HostCopy => report.host_copy += 1,
                }
            }
            if idx.len() == batch {
                let mut cpu = first;
                for _ in 0..2 {
                    cpu = cpu.min(call(idx, what, &mut verdicts)?);
                }
                if slowest.is_none_or(|(most, _)| cpu > most) {
                    slowest = Some((cpu, k));
                }
            }
        }
        if let Some((cpu, k)) = slowest {
            report.slowest = SlowestBatch { what: batches[k].1.clone(), cpu };
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_from_half_the_deadline_on() {
        let report = |cpu_us: u64, deadline_us: u64| SmokeReport {
            slowest: SlowestBatch { what: "a batch of 64 mixed frames".into(), cpu: Duration::from_micros(cpu_us) },
            deadline: Duration::from_micros(deadline_us),
            allowed: Duration::from_micros(deadline_us),
            ..Default::default()
        };
        assert_eq!(report(249, 500).near_deadline(), None);
        let w = report(250, 500).near_deadline().expect("half is near");
        assert_eq!(
            w,
            "its slowest batch: a batch of 64 mixed frames, 250 µs of CPU, 50 % of deadline_us 500: real traffic may run past the deadline and fault (raise deadline_us, or lower switch.batch: the deadline is per batch)"
        );
        assert!(report(600, 500).near_deadline().is_some());
        assert_eq!(
            report(0, 500).timing(),
            "slowest batch: a batch of 64 mixed frames, 0 µs of CPU, 0 % of deadline_us 500"
        );
        // Enforced in whole ticks: measured against what a call always gets.
        let rounded = SmokeReport { allowed: Duration::from_millis(1), ..report(400, 10) };
        assert_eq!(rounded.near_deadline(), None, "{}", rounded.timing());
        assert_eq!(
            rounded.timing(),
            "slowest batch: a batch of 64 mixed frames, 400 µs of CPU, 40 % of its deadline (deadline_us 10, enforced in whole epoch ticks: 1000 µs)"
        );
        assert!(SmokeReport { allowed: Duration::from_millis(1), ..report(500, 10) }.near_deadline().is_some());
    }
}
