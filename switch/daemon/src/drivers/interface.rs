//! The kernel interface behind a port (an AF_XDP port's, the host port's TAP), as every
//! driver that has one shares it: the kernel's drop counters on it, made monotonic across the
//! interface being deleted and re-created, and the metrics of the watch over it.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::DescriptorEncoder;

use super::PortInfo;
use crate::prom::counter_family;

/// A counter the kernel keeps on a port's interface (read at scrape time), made monotonic
/// across the interface being deleted and re-created: the port's series goes on from what
/// the old interface had counted when last read, instead of restarting at zero.
#[derive(Debug, Default)]
pub struct KernelCount {
    base: AtomicU64,
    last: AtomicU64,
}

impl KernelCount {
    /// The series' value for a fresh reading `raw` of the interface's counter.
    pub fn observe(&self, raw: u64) -> u64 {
        self.last.store(raw, Ordering::Relaxed);
        self.base.load(Ordering::Relaxed) + raw
    }

    /// The value while the interface cannot be read (gone): the last one.
    pub fn held(&self) -> u64 {
        self.base.load(Ordering::Relaxed) + self.last.load(Ordering::Relaxed)
    }

    /// The count for the port re-attached to a new interface, whose own counter starts at 0.
    pub fn carried(&self) -> KernelCount {
        KernelCount { base: AtomicU64::new(self.held()), last: AtomicU64::new(0) }
    }
}

/// The drop counters the kernel keeps on a port's interface, each a [`KernelCount`].
#[derive(Debug, Default)]
pub struct KernelDrops {
    /// The interface's `rx_dropped` (sysfs).
    pub rx: KernelCount,
    /// The interface's `tx_dropped` (sysfs).
    pub tx: KernelCount,
    /// A veth's peer's `tx_dropped` (rtnetlink, in the peer's namespace).
    pub veth_peer: KernelCount,
}

impl KernelDrops {
    /// The counts for the port re-attached to a new interface.
    pub fn carried(&self) -> KernelDrops {
        KernelDrops { rx: self.rx.carried(), tx: self.tx.carried(), veth_peer: self.veth_peer.carried() }
    }
}

/// Writes the families of the ports' interfaces: the watch's events, the interface's own
/// dropped counters and a veth peer's.
pub(crate) fn encode(e: &mut DescriptorEncoder, ports: &[&PortInfo]) -> std::fmt::Result {
    // The interface's own drop counters (veth: a full peer ring or backlog), from sysfs.
    // Not read while the port is gone: an interface of that name then may be a new one.
    let mut ifdrops = Vec::new();
    for info in ports {
        let Some(ifname) = &info.interface else { continue };
        let gone = info.gone.load(std::sync::atomic::Ordering::Relaxed);
        for (dir, count) in [("rx", &info.kernel_drops.rx), ("tx", &info.kernel_drops.tx)] {
            let path = format!("/sys/class/net/{ifname}/statistics/{dir}_dropped");
            let raw = if gone { None } else { std::fs::read_to_string(path).ok() };
            let v = match raw.and_then(|t| t.trim().parse::<u64>().ok()) {
                Some(raw) => count.observe(raw),
                None => count.held(),
            };
            ifdrops.push((vec![("port", info.name.clone()), ("direction", dir.to_string())], v));
        }
    }
    let mut events = Vec::new();
    for info in ports.iter().filter(|i| i.interface.is_some()) {
        for (event, c) in [
            ("gone", &info.gone_events),
            ("back", &info.back_events),
            ("down", &info.down_events),
            ("up", &info.up_events),
        ] {
            events.push((
                vec![("port", info.name.clone()), ("event", event.to_string())],
                c.load(std::sync::atomic::Ordering::Relaxed),
            ));
        }
    }
    counter_family(
        e,
        "wasmswitch_port_interface_events",
        "Times a port's interface disappeared (gone) and the port was re-attached when it came back (back), and its link went down (down) and up (up).",
        &events,
    )?;
    counter_family(
        e,
        "wasmswitch_port_interface_dropped",
        "The kernel interface's own dropped counters (/sys/class/net/IF/statistics/{rx,tx}_dropped).",
        &ifdrops,
    )?;
    // A veth port's peer drops what it cannot hand to this end and counts it only on
    // itself, often in a container's namespace: two RTM_GETLINK round trips per veth port.
    let mut peer_drops = Vec::new();
    for info in ports {
        let Some(ifname) = &info.interface else { continue };
        let count = &info.kernel_drops.veth_peer;
        if info.gone.load(std::sync::atomic::Ordering::Relaxed) {
            // Held at its last value while gone (only veth ports ever had one).
            if count.held() > 0 {
                peer_drops.push((vec![("port", info.name.clone())], count.held()));
            }
            continue;
        }
        let ifindex = wasmswitch_sys::ifindex(ifname);
        if let Some(v) = ifindex.and_then(|i| wasmswitch_afxdp::sys::veth_peer_tx_dropped(i).ok().flatten()) {
            peer_drops.push((vec![("port", info.name.clone())], count.observe(v)));
        }
    }
    counter_family(
        e,
        "wasmswitch_port_veth_peer_dropped",
        "Frames a veth port's peer dropped on their way into the port (the peer's tx_dropped): its ring to the port's XDP was full, or a frame was over the port's MTU. The switch never saw them.",
        &peer_drops,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::KernelCount;

    #[test]
    fn a_kernel_count_never_goes_back_across_a_new_interface() {
        let c = KernelCount::default();
        assert_eq!((c.observe(5), c.observe(9)), (5, 9));
        assert_eq!(c.held(), 9, "gone: the last value");
        // Re-attached to a new interface whose own counter starts again.
        let c = c.carried();
        assert_eq!((c.held(), c.observe(0), c.observe(3)), (9, 9, 12));
    }
}
