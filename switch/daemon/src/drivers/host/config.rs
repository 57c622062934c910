//! The host port's `host:` section: the TAP the switch creates, its MAC and MTU, its host
//! workers and their rings, and the port's VLANs; its checks and the frames it holds.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};
use wasmswitch_core::umem::HEADROOM;
use wasmswitch_core::wire::MacAddr;

use crate::schema::l2;
use crate::schema::{default_mtu, is_name, max_mtu, unknown, within, ConfigError, Mac, MTU_MIN};

/// Ranges of the section's numeric keys (inclusive; the README's configuration reference
/// lists them).
pub mod range {
    /// `host.workers`: host worker threads.
    pub const HOST_WORKERS: (usize, usize) = (1, 16);
    /// `host.bulk`: frames per delivery.
    pub const HOST_BULK: (usize, usize) = (1, 64);
    /// `host.ring_size`, a power of two besides.
    pub const HOST_RING: (usize, usize) = (16, 65536);
}

/// The host port: a TAP device the switch creates (and removes on exit), served by host
/// workers over io_uring. To L2 it is a normal port (learned, flooded to); verdict `host` sends
/// frames there.
#[derive(Deserialize, Serialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// The port's name in the switch (metrics, API, `to:` lists).
    #[serde(default = "default_host_name")]
    pub name: Spanned<String>,
    /// TAP device name (at most 15 bytes).
    pub tap: Spanned<String>,
    /// MAC address of the TAP (the host's own address on the switch).
    #[serde(default = "default_host_mac")]
    pub mac: Spanned<Mac>,
    /// The TAP's MTU (default 1500): as a port's, less one (68-1769 with 2048-byte frames), so
    /// that a frame the TAP's read cut short is never taken for a whole one.
    #[serde(default = "default_mtu")]
    pub mtu: Spanned<u32>,
    /// Host worker threads (one TAP queue each).
    #[serde(default = "one_usize")]
    pub workers: Spanned<usize>,
    /// Entries of each ring between a datapath worker and a host worker.
    #[serde(default = "default_host_ring")]
    pub ring_size: Spanned<usize>,
    /// Frames per delivery (cpumap's bulk is 8), 1-64.
    #[serde(default = "default_host_bulk")]
    pub bulk: Spanned<usize>,
    /// The host port's VLANs (as a port's `vlan:`); an access port of VLAN 1 when absent.
    #[serde(default)]
    pub vlan: Option<l2::VlanSection>,
}

fn default_host_name() -> Spanned<String> {
    Spanned::new("host".into(), Location::UNKNOWN, Location::UNKNOWN)
}
fn default_host_mac() -> Spanned<Mac> {
    unknown(Mac(MacAddr([0x02, 0xee, 0, 0, 0, 1])))
}
fn one_usize() -> Spanned<usize> {
    Spanned::new(1, Location::UNKNOWN, Location::UNKNOWN)
}
// The host port's defaults are the library's, written once there.
fn default_host_ring() -> Spanned<usize> {
    unknown(wasmswitch_tap::HostConfig::default().ring_size)
}
fn default_host_bulk() -> Spanned<usize> {
    unknown(wasmswitch_tap::HostConfig::default().bulk)
}

impl HostSection {
    /// The host port: its name among the ports', its TAP (a name of its own, free, a unicast
    /// MAC), MTU, workers, bulk and rings.
    /// `names` holds the configured ports' names and `interfaces` their interfaces (with their
    /// port), with where each is written; `frame_size` is `pool.frame_size`.
    pub fn check(
        &self,
        frame_size: u32,
        names: &HashMap<&str, Location>,
        interfaces: &HashMap<&str, (&str, Location)>,
        err: &impl Fn(Location, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let (h, fs) = (self, frame_size);
        let mtu_range = (MTU_MIN, max_mtu(fs));
        let name = &h.name.value;
        // It is a port like the others: in metrics labels, the API and plugin logs.
        if !is_name(name) {
            return Err(err(
                h.name.referenced,
                format!("host port name `{name}` is not valid: expected 1-32 letters, digits, `-`, `_` or `.`"),
            ));
        }
        if let Some(first) = names.get(name.as_str()) {
            return Err(err(
                h.name.referenced,
                format!("host port name `{name}` is already used by the port at line {}", first.line()),
            ));
        }
        if let Some((port, _)) = interfaces.get(h.tap.value.as_str()) {
            return Err(err(
                h.tap.referenced,
                format!("host.tap `{}` is port `{port}`'s interface; the TAP needs a name of its own", h.tap.value),
            ));
        }
        // The same rule as when the TAP is made, so that `check` refuses what `run` would.
        if let Err(e) = wasmswitch_tap::check_name(&h.tap.value).and_then(|()| wasmswitch_tap::check_free(&h.tap.value))
        {
            return Err(err(h.tap.referenced, format!("{e}")));
        }
        if let Err(e) = wasmswitch_tap::check_mac(h.mac.value.0) {
            return Err(err(h.mac.referenced, format!("{e}")));
        }
        // One byte less than a port's: the TAP is read into the frame past its headroom, and
        // a frame that fills that room could have been cut short (tun truncates to the
        // read); a frame the MTU admits must not fill it, so that one that does is dropped
        // as oversize, never forwarded truncated.
        let host_mtu = (mtu_range.0, mtu_range.1 - 1);
        if !(host_mtu.0..=host_mtu.1).contains(&h.mtu.value) {
            return Err(err(
                h.mtu.referenced,
                format!(
                    "host.mtu {} is out of range: expected {}-{} ({fs}-byte frames less {HEADROOM} bytes of headroom and 22 of Ethernet and VLAN headers, less one byte to tell a frame cut short by the TAP read)",
                    h.mtu.value, host_mtu.0, host_mtu.1
                ),
            ));
        }
        within(&err, "host.workers", &h.workers, range::HOST_WORKERS)?;
        within(&err, "host.bulk", &h.bulk, range::HOST_BULK)?;
        let (lo, hi) = range::HOST_RING;
        if !h.ring_size.value.is_power_of_two() || !(lo..=hi).contains(&h.ring_size.value) {
            return Err(err(
                h.ring_size.referenced,
                format!("host.ring_size {} is not valid: expected a power of two from {lo} to {hi}", h.ring_size.value),
            ));
        }
        Ok(())
    }

    /// Frames the host port holds with `workers` datapath workers: both directions' rings per
    /// (datapath worker, host worker) pair, plus reads in flight.
    pub fn frames_needed(&self, workers: u64) -> u64 {
        let m = |a: u64, b: u64| a.saturating_mul(b);
        let hw = self.workers.value as u64;
        m(m(m(2, workers), hw), self.ring_size.value as u64).saturating_add(m(hw, 256))
    }
}
