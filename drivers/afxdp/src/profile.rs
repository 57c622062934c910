//! Driver profiles: which XDP attach mode, AF_XDP bind mode and queues a port gets.
//!
//! The choice is a pure function of the kernel driver name (`ETHTOOL_GDRVINFO`), the queue count
//! (`ETHTOOL_GCHANNELS`) and the operator's overrides, so it is unit-tested for every profile
//! even where the hardware is absent.
//!
//! | driver      | attach  | bind      | why |
//! |-------------|---------|-----------|-----|
//! | `mlx5_core` | native  | zero-copy | mlx5 implements `ndo_xsk_wakeup` and XSK pools on every channel: frames are DMA'd straight into the UMEM. |
//! | `mvpp2`     | native  | copy      | native XDP (page_pool, seed series), but no AF_XDP zero-copy in the driver. |
//! | `veth`      | native  | copy      | veth runs XDP in its NAPI path; it has no zero-copy. |
//! | anything else | generic (SKB) | copy | works on every netdev; slowest, but never refuses to start. |
//!
//! Partial checksums: a frame sent by a local socket through a device that offloads its TCP/UDP
//! checksum carries only the pseudo-header sum (the skb's `CHECKSUM_PARTIAL` state does not
//! survive XDP). Only virtual devices (`veth`, `tun`) hand such frames to XDP, so their profiles
//! complete them; frames off a wire (every NIC) are complete and left alone, so a corrupt one
//! is never "repaired".
//!
//! The mlx5 and mvpp2 rows cannot be exercised on the test machines (no such NICs); they are the
//! documented behaviour of those drivers in Linux 6.x and are covered by unit tests of this table
//! only. Overrides always win over the profile.

use std::fmt;

/// Where the XDP program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`).
    Native,
    /// In the generic SKB path (`XDP_FLAGS_SKB_MODE`), any netdev.
    Generic,
}

/// How AF_XDP sockets bind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindMode {
    /// `XDP_COPY`: the kernel copies packets into / out of the UMEM.
    Copy,
    /// `XDP_ZEROCOPY`: the NIC DMAs into the UMEM directly.
    ZeroCopy,
}

impl AttachMode {
    /// The mode as logs and metric labels name it.
    pub fn label(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
        }
    }

    /// The `XDP_FLAGS_*` mode bit for `BPF_LINK_CREATE`.
    pub fn xdp_flags(self) -> u32 {
        match self {
            AttachMode::Native => crate::bpf::XDP_FLAGS_DRV_MODE,
            AttachMode::Generic => crate::bpf::XDP_FLAGS_SKB_MODE,
        }
    }
}

impl BindMode {
    /// The mode as logs and metric labels name it.
    pub fn label(self) -> &'static str {
        match self {
            BindMode::Copy => "copy",
            BindMode::ZeroCopy => "zero-copy",
        }
    }

    /// The value of the config's `bind:` key that selects this mode.
    pub fn config_value(self) -> &'static str {
        match self {
            BindMode::Copy => "copy",
            BindMode::ZeroCopy => "zerocopy",
        }
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl fmt::Display for BindMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Entries per ring (each a power of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSizes {
    /// RX ring: received descriptors waiting for the worker.
    pub rx: u32,
    /// TX ring: descriptors posted for sending.
    pub tx: u32,
    /// Fill ring: free frames the kernel receives into.
    pub fill: u32,
    /// Completion ring: frames the kernel has sent, to go back to the pool.
    pub completion: u32,
}

impl RingSizes {
    /// Every ring with `n` entries (the config's `ring_size`).
    pub fn all(n: u32) -> Self {
        Self { rx: n, tx: n, fill: n, completion: n }
    }
}

impl Default for RingSizes {
    /// RX and fill 4096, TX and completion 1024. The RX ring is the switch's buffer for a burst
    /// that arrives while the worker is busy, and TCP makes such bursts: a batch of ACKs the
    /// worker delivers to a local sender makes that sender transmit inside the worker's own
    /// `sendto` (veth runs the peer's stack synchronously), up to its whole window at once. A
    /// Linux receiver's window reaches about 2,000 full-size segments (tcp_rmem's 6 MiB), so
    /// 1024 entries overflowed under a single iperf3 flow (thousands of retransmits in 5 s) and
    /// 2048 only just held it; 4096 holds it with room. TX drains at least 32 frames per kick
    /// and is kicked every round, so it never needs more than a few bursts.
    fn default() -> Self {
        Self { rx: 4096, tx: 1024, fill: 4096, completion: 1024 }
    }
}

/// Operator overrides (from the YAML port section). `None` means "what the profile says".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Where the XDP program runs.
    pub attach: Option<AttachMode>,
    /// How the sockets bind.
    pub bind: Option<BindMode>,
    /// Queue ids to open; default: every queue the interface has.
    pub queues: Option<Vec<u32>>,
    /// Ring sizes.
    pub rings: Option<RingSizes>,
    /// Complete TCP/UDP checksums left to offload by a local sender (`None`: the profile's).
    pub complete_partial_checksums: Option<bool>,
}

/// What the driver will do on one interface, for logs and as a metric label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The kernel driver name as reported by ethtool (`unknown` when it would not say).
    pub driver: String,
    /// The profile that matched (`mlx5_core`, `mvpp2`, `veth` or `generic`).
    pub profile: &'static str,
    /// Where the XDP program runs.
    pub attach: AttachMode,
    /// How the sockets bind.
    pub bind: BindMode,
    /// Queues to open, ascending, no duplicates.
    pub queues: Vec<u32>,
    /// Queues the interface has (RX or combined channels).
    pub channels: u32,
    /// Entries of each ring of each socket.
    pub rings: RingSizes,
    /// Complete TCP/UDP checksums that a local sender left to offload (virtual devices only).
    pub complete_partial_checksums: bool,
    /// True when an override changed what the profile chose.
    pub overridden: bool,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "driver {} (profile {}{}): {} XDP, {} bind, queues {:?} of {}",
            self.driver,
            self.profile,
            if self.overridden { ", overridden" } else { "" },
            self.attach,
            self.bind,
            self.queues,
            self.channels
        )?;
        if self.complete_partial_checksums {
            f.write_str(", partial checksums completed")?;
        }
        Ok(())
    }
}

/// Picks attach mode, bind mode, queues and ring sizes. Pure; validation against the interface
/// (queue ids in range, ring sizes powers of two) is `Decision::check`'s job.
pub fn decide(driver: &str, channels: u32, ov: &Overrides) -> Decision {
    let channels = channels.max(1);
    let (profile, attach, bind) = match driver {
        "mlx5_core" => ("mlx5_core", AttachMode::Native, BindMode::ZeroCopy),
        "mvpp2" => ("mvpp2", AttachMode::Native, BindMode::Copy),
        "veth" => ("veth", AttachMode::Native, BindMode::Copy),
        _ => ("generic", AttachMode::Generic, BindMode::Copy),
    };
    let partial = matches!(driver, "veth" | "tun");
    let mut queues = ov.queues.clone().unwrap_or_else(|| (0..channels).collect());
    queues.sort_unstable();
    queues.dedup();
    let rings = ov.rings.unwrap_or_default();
    let overridden = ov.attach.is_some_and(|a| a != attach)
        || ov.bind.is_some_and(|b| b != bind)
        || ov.queues.is_some()
        || ov.rings.is_some_and(|r| r != RingSizes::default())
        || ov.complete_partial_checksums.is_some_and(|c| c != partial);
    Decision {
        driver: if driver.is_empty() { "unknown".into() } else { driver.into() },
        profile,
        attach: ov.attach.unwrap_or(attach),
        bind: ov.bind.unwrap_or(bind),
        queues,
        channels,
        rings,
        complete_partial_checksums: ov.complete_partial_checksums.unwrap_or(partial),
        overridden,
    }
}

/// Channel count from `ETHTOOL_GCHANNELS`: combined channels plus RX-only ones (veth reports
/// its real RX queue count as `rx_count`, mlx5 reports `combined_count`).
pub fn queue_count(combined: u32, rx: u32) -> u32 {
    (combined + rx).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx5_is_native_zero_copy_on_all_queues() {
        let d = decide("mlx5_core", 8, &Overrides::default());
        assert_eq!((d.profile, d.attach, d.bind), ("mlx5_core", AttachMode::Native, BindMode::ZeroCopy));
        assert_eq!(d.queues, (0..8).collect::<Vec<_>>());
        assert!(!d.overridden);
    }

    #[test]
    fn mvpp2_is_native_copy() {
        let d = decide("mvpp2", 4, &Overrides::default());
        assert_eq!((d.profile, d.attach, d.bind), ("mvpp2", AttachMode::Native, BindMode::Copy));
        assert_eq!(d.queues, vec![0, 1, 2, 3]);
    }

    #[test]
    fn only_virtual_devices_complete_partial_checksums() {
        for (drv, want) in [("veth", true), ("tun", true), ("mlx5_core", false), ("mvpp2", false), ("e1000e", false)] {
            assert_eq!(decide(drv, 1, &Overrides::default()).complete_partial_checksums, want, "{drv}");
        }
        let off = Overrides { complete_partial_checksums: Some(false), ..Default::default() };
        let d = decide("veth", 1, &off);
        assert!(!d.complete_partial_checksums && d.overridden);
    }

    #[test]
    fn veth_is_native_copy() {
        let d = decide("veth", 2, &Overrides::default());
        assert_eq!((d.profile, d.attach, d.bind), ("veth", AttachMode::Native, BindMode::Copy));
        assert_eq!(d.queues, vec![0, 1]);
    }

    #[test]
    fn unknown_drivers_get_generic_copy() {
        for drv in ["e1000", "virtio_net", "tun", "bridge", ""] {
            let d = decide(drv, 1, &Overrides::default());
            assert_eq!((d.profile, d.attach, d.bind), ("generic", AttachMode::Generic, BindMode::Copy), "{drv}");
        }
        assert_eq!(decide("", 1, &Overrides::default()).driver, "unknown");
    }

    #[test]
    fn overrides_win_and_are_flagged() {
        let ov = Overrides {
            attach: Some(AttachMode::Generic),
            bind: Some(BindMode::Copy),
            queues: Some(vec![3, 1, 3]),
            rings: Some(RingSizes { rx: 256, tx: 256, fill: 512, completion: 512 }),
            complete_partial_checksums: None,
        };
        let d = decide("mlx5_core", 8, &ov);
        assert_eq!((d.attach, d.bind), (AttachMode::Generic, BindMode::Copy));
        assert_eq!(d.queues, vec![1, 3], "sorted, deduplicated");
        assert_eq!(d.rings.fill, 512);
        assert!(d.overridden);
        // An override equal to the profile's choice is not an override worth flagging.
        let same = Overrides { bind: Some(BindMode::Copy), ..Default::default() };
        assert!(!decide("veth", 1, &same).overridden);
    }

    #[test]
    fn channel_counts() {
        assert_eq!(queue_count(0, 2), 2, "veth: rx_count");
        assert_eq!(queue_count(16, 0), 16, "mlx5: combined");
        assert_eq!(queue_count(0, 0), 1, "no channel info: one queue");
        assert_eq!(decide("veth", 0, &Overrides::default()).queues, vec![0]);
    }

    #[test]
    fn display_is_one_readable_line() {
        let s = decide("veth", 2, &Overrides::default()).to_string();
        assert_eq!(
            s,
            "driver veth (profile veth): native XDP, copy bind, queues [0, 1] of 2, partial checksums completed"
        );
        let s = decide("mlx5_core", 2, &Overrides::default()).to_string();
        assert!(!s.contains("checksum"), "{s}");
    }
}
