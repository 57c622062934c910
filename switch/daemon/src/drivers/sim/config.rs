//! A sim port's `sim:` section: NIC queues in memory and the traffic generated on them; its
//! checks, the frames it holds, and which of its keys a reload applies live.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_saphyr::{Location, Spanned};
use wasmswitch_core::umem::HEADROOM;

use crate::drivers::CheckCtx;
use crate::schema::l2;
use crate::schema::{unknown, ConfigError};

/// Ranges of the section's numeric keys (inclusive; the README's configuration reference
/// lists them).
pub mod range {
    /// `sim.queues`: queues of the simulated NIC.
    pub const SIM_QUEUES: (u16, u16) = (1, 64);
    /// `sim.ring_size`: entries of each queue's fill and TX rings.
    pub const SIM_RING: (usize, usize) = (64, 16384);
    /// `sim.traffic.rate_pps`: packets per second per queue.
    pub const RATE_PPS: (u64, u64) = (1, 1_000_000_000);
    /// `sim.traffic.src_macs`: distinct source MACs.
    pub const SRC_MACS: (u32, u32) = (1, 1 << 20);
    /// `sim.traffic.flows`: distinct flows.
    pub const FLOWS: (u32, u32) = (1, 1 << 20);
    /// Sizes in `sim.traffic.frame_sizes`.
    pub const FRAME_SIZES_LEN: (usize, usize) = (1, 1024);
}

/// A port's `sim:` section: an in-memory NIC and the traffic generated on it.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct SimSection {
    /// Queues of the simulated NIC (default 1, 1-64).
    #[serde(default = "one")]
    pub queues: Spanned<u16>,
    /// Entries of each queue's fill and TX rings (default 1024, 64-16384).
    #[serde(default = "default_ring_size")]
    pub ring_size: Spanned<usize>,
    /// Generated traffic arriving on this port; none when absent.
    #[serde(default)]
    pub traffic: Option<TrafficSection>,
}

impl Default for SimSection {
    fn default() -> Self {
        Self { queues: one(), ring_size: default_ring_size(), traffic: None }
    }
}

fn one() -> Spanned<u16> {
    Spanned::new(1, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_ring_size() -> Spanned<usize> {
    unknown(1024)
}

/// `sim.traffic`: the frames a sim port's NIC receives, generated.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TrafficSection {
    /// Packets per second per queue; unlimited when absent.
    #[serde(default)]
    pub rate_pps: Option<Spanned<u64>>,
    /// Distinct source MACs (default 256, 1-1048576); the port's hosts, which other ports'
    /// traffic addresses.
    #[serde(default = "default_src_macs")]
    pub src_macs: Spanned<u32>,
    /// Frame sizes in bytes, cycled (default `[64]`; 1-1024 sizes, each 60 to frame_size - 256):
    /// an IMIX is a list.
    #[serde(default = "default_sizes")]
    pub frame_sizes: Spanned<Vec<usize>>,
    /// Share of broadcast frames, in percent (default 5, 0-100).
    #[serde(default = "default_bcast")]
    pub broadcast_percent: Spanned<f64>,
    /// Distinct flows, by IP addresses and source port (default 1024, 1-1048576).
    #[serde(default = "default_flows")]
    pub flows: Spanned<u32>,
    /// Tag the frames with this VLAN, or spread them over a list of VLANs (each source MAC
    /// speaks in one of them and addresses hosts of the same one): `vlan: 10`,
    /// `vlan: [10, "20-22"]`.
    #[serde(default)]
    pub vlan: Option<Spanned<l2::VidList>>,
    /// Ports whose hosts this traffic is addressed to (default: every other sim port).
    #[serde(default)]
    pub to: Option<Vec<Spanned<String>>>,
    /// IP version of the frames: 4 or 6.
    #[serde(default = "default_ip")]
    pub ip: Spanned<u8>,
    /// `udp` (the default) or `tcp` (with `tcp_flags`).
    #[serde(default)]
    pub proto: TrafficProto,
    /// TCP flags of every segment, as letters: `S` (SYN), `A` (ACK), `F`, `R`, `P`; e.g. `SA`.
    #[serde(default)]
    pub tcp_flags: Option<Spanned<String>>,
    /// Destination TCP/UDP port.
    #[serde(default = "default_dst_port")]
    pub dst_port: Spanned<u16>,
}

/// What generated traffic carries above IP.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TrafficProto {
    /// UDP datagrams.
    #[default]
    Udp,
    /// TCP segments, all with the flags of `tcp_flags`.
    Tcp,
}

fn default_ip() -> Spanned<u8> {
    unknown(4)
}
fn default_dst_port() -> Spanned<u16> {
    unknown(5001)
}

impl TrafficSection {
    /// The TCP flag byte of `tcp_flags` (SYN when not given), or the letter that is not one.
    pub fn tcp_flag_bits(&self) -> Result<u8, char> {
        use wasmswitch_core::wire::build::tcp_flags as f;
        let Some(letters) = &self.tcp_flags else { return Ok(f::SYN) };
        letters.value.chars().try_fold(0u8, |acc, c| {
            Ok(acc
                | match c.to_ascii_uppercase() {
                    'S' => f::SYN,
                    'A' => f::ACK,
                    'F' => f::FIN,
                    'R' => f::RST,
                    'P' => f::PSH,
                    _ => return Err(c),
                })
        })
    }
}

fn default_src_macs() -> Spanned<u32> {
    unknown(256)
}
fn default_sizes() -> Spanned<Vec<usize>> {
    Spanned::new(vec![64], Location::UNKNOWN, Location::UNKNOWN)
}
fn default_bcast() -> Spanned<f64> {
    Spanned::new(5.0, Location::UNKNOWN, Location::UNKNOWN)
}
fn default_flows() -> Spanned<u32> {
    unknown(1024)
}

impl SimSection {
    /// Checks the section of port `ctx.port`: ranges, the generator's frames and flags, and
    /// the ports its traffic is addressed to.
    pub fn check(&self, ctx: &CheckCtx<'_>, err: &impl Fn(Location, String) -> ConfigError) -> Result<(), ConfigError> {
        let (name, sim) = (ctx.port, self);
        let (lo, hi) = range::SIM_QUEUES;
        if !(lo..=hi).contains(&sim.queues.value) {
            return Err(err(
                sim.queues.referenced,
                format!("port `{name}`: queues {} is out of range: expected {lo}-{hi}", sim.queues.value),
            ));
        }
        let (lo, hi) = range::SIM_RING;
        if !(lo..=hi).contains(&sim.ring_size.value) {
            return Err(err(
                sim.ring_size.referenced,
                format!("port `{name}`: ring_size {} is out of range: expected {lo}-{hi}", sim.ring_size.value),
            ));
        }
        let Some(t) = &sim.traffic else { return Ok(()) };
        if let Some(r) = &t.rate_pps {
            let (lo, hi) = range::RATE_PPS;
            if !(lo..=hi).contains(&r.value) {
                return Err(err(r.referenced, format!("rate_pps {} is out of range: expected {lo}-{hi}", r.value)));
            }
        }
        for (key, v, (lo, hi)) in [("src_macs", &t.src_macs, range::SRC_MACS), ("flows", &t.flows, range::FLOWS)] {
            if !(lo..=hi).contains(&v.value) {
                return Err(err(v.referenced, format!("{key} {} is out of range: expected {lo}-{hi}", v.value)));
            }
        }
        let b = t.broadcast_percent.value;
        if !(0.0..=100.0).contains(&b) {
            return Err(err(
                t.broadcast_percent.referenced,
                format!("broadcast_percent {b} is out of range: expected 0-100"),
            ));
        }
        let max = (ctx.frame_size - HEADROOM) as usize;
        if t.frame_sizes.value.is_empty() {
            return Err(err(t.frame_sizes.referenced, "frame_sizes is empty: list at least one size in bytes".into()));
        }
        if t.frame_sizes.value.len() > range::FRAME_SIZES_LEN.1 {
            return Err(err(
                t.frame_sizes.referenced,
                format!("frame_sizes lists {} sizes: at most {}", t.frame_sizes.value.len(), range::FRAME_SIZES_LEN.1),
            ));
        }
        if let Some(&bad) = t.frame_sizes.value.iter().find(|&&s| !(60..=max).contains(&s)) {
            return Err(err(t.frame_sizes.referenced, format!("frame size {bad} is out of range: expected 60-{max}")));
        }
        if t.ip.value != 4 && t.ip.value != 6 {
            return Err(err(t.ip.referenced, format!("ip {} is not an IP version: expected 4 or 6", t.ip.value)));
        }
        if let Some(fl) = &t.tcp_flags {
            if t.proto != TrafficProto::Tcp {
                return Err(err(fl.referenced, "tcp_flags needs proto: tcp".to_string()));
            }
            if let Err(c) = t.tcp_flag_bits() {
                return Err(err(
                    fl.referenced,
                    format!("tcp_flags `{}`: `{c}` is not a flag (expected letters of S, A, F, R, P)", fl.value),
                ));
            }
        }
        if let Some(v) = &t.vlan {
            let vids = v.value.expand("vlan").map_err(|e| err(v.referenced, e))?;
            if vids.is_empty() || vids.len() > 64 {
                return Err(err(v.referenced, format!("vlan lists {} VLANs: expected 1-64", vids.len())));
            }
        }
        for to in t.to.iter().flatten() {
            if !ctx.ports.contains(&to.value.as_str()) {
                let names: Vec<String> = ctx.ports.iter().map(|p| format!("`{p}`")).collect();
                return Err(err(
                    to.referenced,
                    format!("unknown port `{}` in traffic.to: expected one of {}", to.value, names.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// Frames the port's queues can hold at once: a full fill ring and a full TX ring each.
    pub fn frames_needed(&self) -> u64 {
        (self.queues.value as u64).saturating_mul(self.ring_size.value as u64).saturating_mul(2)
    }
}

/// Frames a sim port without a `sim:` section holds: one queue per worker (`workers`), each
/// with both rings of the default size.
pub fn frames_needed_default(workers: u64) -> u64 {
    (default_ring_size().value as u64).saturating_mul(2).saturating_mul(workers)
}

/// Whether adding or removing a sim port (`port`, as the diff writes it) applies live: not
/// when it has generated traffic (the other generators' destinations are fixed when they
/// start).
pub fn port_change_live(port: &Value) -> bool {
    port.pointer("/sim/traffic").is_none_or(Value::is_null)
}

/// Whether a change of `ports[i].sim{rest}` from `old` to `new` (JSON text) applies live: the
/// port's queues are replaced and its counters carry on, except when traffic is given to it or
/// taken away (that changes the others' destinations).
pub fn key_change_live(rest: &str, old: &str, new: &str) -> bool {
    if rest.is_empty() {
        let traffic = |side: &str| {
            serde_json::from_str::<Value>(side)
                .ok()
                .and_then(|v| v.get("traffic").cloned())
                .is_some_and(|t| !t.is_null())
        };
        return !traffic(old) && !traffic(new);
    }
    if rest == ".traffic" {
        return old != "null" && new != "null";
    }
    rest.starts_with('.')
}
