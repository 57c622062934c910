//! An AF_XDP port's `afxdp:` section: the interface, its queues, rings and modes; its checks,
//! what the AF_XDP library is asked to open, the frames it holds, and the warnings an
//! interface here gives against it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_saphyr::{Location, Spanned};

use crate::drivers::CheckCtx;
pub use wasmswitch_afxdp::{AttachMode, BindMode};

use crate::schema::{max_frame, max_mtu, Auto, Choice, ConfigError};

/// Ranges of the section's numeric keys (inclusive; the README's configuration reference
/// lists them).
pub mod range {
    /// Ids in `afxdp.queues`.
    pub const AFXDP_QUEUES_LEN: (usize, usize) = (1, 64);
    /// One queue id of `afxdp.queues`.
    pub const AFXDP_QUEUE_ID: (u32, u32) = (0, 1023);
    /// `afxdp.ring_size`, a power of two besides.
    pub const AFXDP_RING: (u32, u32) = (64, 16384);
}

impl Choice for AttachMode {
    const ALL: &'static [Self] = &[AttachMode::Native, AttachMode::Generic];
    const WORDS: &'static [&'static str] = &["auto", "native", "generic"];
    fn word(self) -> &'static str {
        self.label()
    }
}

impl Choice for BindMode {
    const ALL: &'static [Self] = &[BindMode::Copy, BindMode::ZeroCopy];
    const WORDS: &'static [&'static str] = &["auto", "copy", "zerocopy"];
    fn word(self) -> &'static str {
        self.config_value()
    }
}

/// A port's `afxdp:` section: the kernel interface it opens and how.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct AfxdpSection {
    /// The kernel interface (1-15 characters); one port per interface.
    pub interface: Spanned<String>,
    /// `native`, `generic`, or `auto` (the default: the driver profile's).
    #[serde(default)]
    pub mode: Auto<AttachMode>,
    /// `copy`, `zerocopy`, or `auto` (the default: the driver profile's).
    #[serde(default)]
    pub bind: Auto<BindMode>,
    /// Queue ids to open; all of the interface's queues when absent.
    #[serde(default)]
    pub queues: Option<Spanned<Vec<u32>>>,
    /// Entries in each of the RX, TX, fill and completion rings (power of two).
    #[serde(default)]
    pub ring_size: Option<Spanned<u32>>,
    /// TCP/UDP checksums a local sender left to offload: `auto` (the driver profile: completed
    /// on veth and tun, left alone on NICs), `complete`, or `keep` (never touch a frame).
    #[serde(default)]
    pub partial_checksums: PartialChecksums,
    /// Attach even to `lo` or to the interface that carries `metrics.listen`'s address (the
    /// switch would take the host's own traffic, the control API's included).
    #[serde(default)]
    pub allow_control_interface: bool,
}

impl AfxdpSection {
    /// What the AF_XDP library is asked to open for this section (its profile decides the rest).
    pub fn spec(&self) -> wasmswitch_afxdp::PortSpec {
        let a = self;
        let mut spec = wasmswitch_afxdp::PortSpec::new(a.interface.value.clone());
        spec.overrides = wasmswitch_afxdp::Overrides {
            attach: a.mode.get(),
            bind: a.bind.get(),
            queues: a.queues.as_ref().map(|q| q.value.clone()),
            rings: a.ring_size.as_ref().map(|r| wasmswitch_afxdp::RingSizes::all(r.value)),
            complete_partial_checksums: match a.partial_checksums {
                PartialChecksums::Auto => None,
                PartialChecksums::Complete => Some(true),
                PartialChecksums::Keep => Some(false),
            },
        };
        spec
    }
}

/// `afxdp.partial_checksums`: what to do with TCP/UDP checksums a local sender left to offload.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum PartialChecksums {
    /// Chosen by the driver profile.
    #[default]
    Auto,
    /// Complete them on any interface (as `auto` does on veth and tun).
    Complete,
    /// Leave them as they are: a frame is never touched.
    Keep,
}

impl AfxdpSection {
    /// Checks the section of port `ctx.port`: its interface (one port each: `interfaces` holds
    /// the interfaces of the ports checked before, with their port and place; not the control
    /// API's unless allowed), queues and rings, and what `run` would find on the interface here.
    pub fn check<'a>(
        &'a self,
        ctx: &CheckCtx<'a>,
        interfaces: &mut HashMap<&'a str, (&'a str, Location)>,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let name = ctx.port;
        let ifname = &self.interface.value;
        if ifname.is_empty() || ifname.len() >= 16 {
            return Err(err(
                self.interface.referenced,
                format!("interface name `{ifname}` is not valid: expected 1-15 characters"),
            ));
        }
        if let Some((other, at)) = interfaces.insert(ifname, (name, self.interface.referenced)) {
            return Err(err(
                self.interface.referenced,
                format!(
                    "port `{name}`: interface {ifname} is already port `{other}`'s (line {}); an interface takes one XDP program, so one port (list its queues there)",
                    at.line()
                ),
            ));
        }
        let listen = ctx.listen.ip();
        let api_addr =
            interfaces_with(|a| listens_on(listen, a)).into_iter().find(|(i, _)| i == ifname).map(|(_, a)| a);
        if (ifname == "lo" || api_addr.is_some()) && !self.allow_control_interface {
            let carries = match api_addr {
                _ if ifname == "lo" => "the host's loopback traffic".to_string(),
                Some(a) if a == listen => format!("the control API's address {listen}"),
                Some(a) => format!("{a}, where the control API listens (metrics.listen on {listen})"),
                None => unreachable!("checked above"),
            };
            return Err(err(
                self.interface.referenced,
                format!(
                    "port `{name}`: interface {ifname} carries {carries}: attaching to it would take the host's own traffic{}; set `allow_control_interface: true` in this `afxdp:` section if that is what you want",
                    if listen.is_loopback() || api_addr.is_some() { ", the control API's included" } else { "" }
                ),
            ));
        }
        if let Some(q) = &self.queues {
            let (lo, hi) = range::AFXDP_QUEUES_LEN;
            if !(lo..=hi).contains(&q.value.len()) {
                return Err(err(
                    q.referenced,
                    format!(
                        "afxdp.queues lists {} queue ids: expected {lo}-{hi}, or leave it out for all",
                        q.value.len()
                    ),
                ));
            }
            let (lo, hi) = range::AFXDP_QUEUE_ID;
            if let Some(bad) = q.value.iter().find(|&&id| !(lo..=hi).contains(&id)) {
                return Err(err(
                    q.referenced,
                    format!("afxdp.queues: queue id {bad} is out of range: expected {lo}-{hi}"),
                ));
            }
            let mut seen = q.value.clone();
            seen.sort_unstable();
            if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
                return Err(err(q.referenced, format!("afxdp.queues: queue id {} is listed twice", w[0])));
            }
        }
        if let Some(r) = &self.ring_size {
            let (lo, hi) = range::AFXDP_RING;
            if !r.value.is_power_of_two() || !(lo..=hi).contains(&r.value) {
                return Err(err(
                    r.referenced,
                    format!("ring_size {} is not valid: expected a power of two from {lo} to {hi}", r.value),
                ));
            }
        }
        // Where the interface exists here, what `run` would find there: a queue it
        // lacks, or zero-copy its driver does not offer, is refused now as `run`
        // would refuse it (a missing interface is `check`'s warning: the config may
        // be for another machine).
        if wasmswitch_sys::ifindex(ifname).is_some() {
            if let Err(e) = wasmswitch_afxdp::preflight(&self.spec()) {
                let at = match (&e, &self.queues) {
                    (wasmswitch_afxdp::AfXdpError::QueueOutOfRange { .. }, Some(q)) => q.referenced,
                    _ => self.interface.referenced,
                };
                return Err(err(at, e.to_string()));
            }
        }
        Ok(())
    }

    /// What this port's interface here says against the port's settings (see
    /// `Config::interface_warnings`); nothing when the interface is not here.
    pub fn interface_warnings(&self, name: &str, mtu: u32, frame_size: u32) -> Vec<String> {
        let mut out = Vec::new();
        let most = max_mtu(frame_size);
        let iface = &self.interface.value;
        {
            let Ok(raw) = std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu")) else { return out };
            let Ok(iface_mtu) = raw.trim().parse::<u32>() else { return out };
            if iface_mtu > mtu {
                let fix = if iface_mtu <= most {
                    format!("give the port `mtu: {iface_mtu}`")
                } else {
                    format!(
                        "`mtu: {iface_mtu}` needs a larger pool.frame_size (its {}-byte frames hold {most} at most)",
                        frame_size
                    )
                };
                out.push(format!(
                    "port `{name}`: interface {iface} has MTU {iface_mtu}, above the port's mtu {mtu}: frames of more than {} bytes from it are dropped as oversize, and TCP between hosts with that MTU stalls; {fix}, or lower the interface's MTU",
                    max_frame(mtu)
                ));
            } else if iface_mtu < mtu {
                out.push(format!(
                    "port `{name}`: interface {iface} has MTU {iface_mtu}, below the port's mtu {mtu}: frames over {iface_mtu} bytes of payload sent there are dropped by the kernel (afxdp_tx_kernel_drops)"
                ));
            }
            if self.mode == Auto::Set(AttachMode::Generic)
                && wasmswitch_afxdp::sys::driver_name(iface).is_ok_and(|d| d == "veth")
            {
                out.push(format!(
                    "port `{name}`: interface {iface} is a veth in generic (SKB) mode: TCP through it runs far slower than in native mode, the veth default (see README, Real traffic)"
                ));
            }
        }
        out
    }

    /// Frames the port holds at once with `workers` workers: per queue, a full fill ring
    /// (frames the kernel may move to RX) and a full TX ring in flight. Where the interface
    /// exists here, the queues and rings `run` will open (without `queues:`, every queue it
    /// has); elsewhere what the section says.
    pub fn frames_needed(&self, workers: u64) -> u64 {
        let (queues, r) = if wasmswitch_sys::ifindex(&self.interface.value).is_some() {
            let d = wasmswitch_afxdp::decide(&self.spec());
            (d.queues.len() as u64, d.rings)
        } else {
            let r = self
                .ring_size
                .as_ref()
                .map_or_else(wasmswitch_afxdp::RingSizes::default, |r| wasmswitch_afxdp::RingSizes::all(r.value));
            (self.queues.as_ref().map_or(1, |q| q.value.len() as u64), r)
        };
        queues.max(workers).saturating_mul(r.fill as u64 + r.tx as u64)
    }

    /// The UMEM group the port belongs in when it names none: its bind mode as its driver
    /// profile and overrides choose it (the kernel lets only sockets of one bind mode share a
    /// UMEM).
    pub fn umem_group(&self) -> &'static str {
        wasmswitch_afxdp::decide(&self.spec()).bind.config_value()
    }
}

/// Whether adding or removing an AF_XDP port (`port`, as the diff writes it) applies live: it
/// does (the new port opens beside the others; a removed one is closed once every worker has
/// let go of it).
pub fn port_change_live(_port: &Value) -> bool {
    true
}

/// Whether a change of `ports[i].afxdp{rest}` applies live: none does (the interface, its
/// queues, rings and modes are the port's sockets; a restart opens them anew).
pub fn key_change_live(_rest: &str, _old: &str, _new: &str) -> bool {
    false
}

/// The longest frame a port of MTU `mtu` sends: [`max_frame`], but 4 bytes less on a veth. A
/// veth passes a frame to its peer only up to the peer's MTU plus 18 bytes (Ethernet header and
/// one tag: the kernel's `is_skb_forwardable`), and AF_XDP hands it every tag inside the frame;
/// a longer frame would be dropped by the kernel after the switch had counted it as sent.
pub fn max_tx_frame(mtu: u32, veth: bool) -> usize {
    if veth {
        mtu as usize + 14 + 4
    } else {
        max_frame(mtu)
    }
}

/// Whether a server bound to `listen` answers on `addr`: a wildcard is every address of its
/// family (`[::]` takes IPv4 too; IPv6 link-local addresses need a scope, so not those).
fn listens_on(listen: std::net::IpAddr, addr: std::net::IpAddr) -> bool {
    match listen {
        l if !l.is_unspecified() => addr == l,
        std::net::IpAddr::V4(_) => addr.is_ipv4(),
        std::net::IpAddr::V6(_) => !matches!(addr, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local()),
    }
}

/// Every (interface, address) of this namespace whose address `wanted` accepts.
fn interfaces_with(wanted: impl Fn(std::net::IpAddr) -> bool) -> Vec<(String, std::net::IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says which struct it is.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: AF_INET means a sockaddr_in.
                let a = unsafe { *ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                std::net::IpAddr::from(a.sin_addr.s_addr.to_ne_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 means a sockaddr_in6.
                let a = unsafe { *ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                std::net::IpAddr::from(a.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        if wanted(addr) {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            out.push((unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned(), addr));
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::listens_on;

    #[test]
    fn a_wildcard_listen_address_is_on_every_interface_of_its_family() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert!(listens_on(ip("0.0.0.0"), ip("192.0.2.7")));
        assert!(!listens_on(ip("0.0.0.0"), ip("2001:db8::7")));
        assert!(listens_on(ip("::"), ip("192.0.2.7")) && listens_on(ip("::"), ip("2001:db8::7")));
        assert!(!listens_on(ip("::"), ip("fe80::1")), "link-local needs a scope");
        assert!(listens_on(ip("192.0.2.7"), ip("192.0.2.7")) && !listens_on(ip("192.0.2.7"), ip("192.0.2.8")));
    }
}
