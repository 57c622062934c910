//! The host port: a TAP device the switch creates (and removes on exit), served by host
//! workers over io_uring.

pub mod config;
pub(crate) mod metrics;

use std::sync::Arc;

use anyhow::{Context, Result};
use wasmswitch_tap::{HostConfig, HostPort, TapConfig, TapDevice, TapStats};

pub use self::config::HostSection;
use super::{max_frame, DriverInfo, OpenCtx, OpenedPort, PortHandle, PortInfo};

/// What the running host port keeps: its TAP's and host workers' counters.
#[derive(Debug)]
pub struct HostInfo {
    /// Deliveries to the TAP and reads from it.
    pub stats: Arc<TapStats>,
}

impl PortHandle for HostPort {
    fn close(mut self: Box<Self>) {
        self.stop();
    }
}

/// Creates the TAP and starts its host workers; each datapath worker gets one queue.
pub fn open(ctx: &OpenCtx<'_>, h: &HostSection) -> Result<OpenedPort> {
    let tap = TapDevice::create(&TapConfig {
        name: h.tap.value.clone(),
        mac: h.mac.value.0 .0,
        mtu: h.mtu.value,
        queues: h.workers.value,
    })
    .with_context(|| format!("host port `{}`", h.name.value))?;
    let ifindex = tap.ifindex();
    let hc = HostConfig {
        datapath_workers: ctx.workers,
        host_workers: h.workers.value,
        bulk: h.bulk.value,
        ring_size: h.ring_size.value,
        ..HostConfig::default()
    };
    let (hp, queues) = HostPort::start(tap, ctx.pool, &hc).with_context(|| format!("host port `{}`", h.name.value))?;
    log::info!(
        "host port `{}` on TAP {} ({} host worker(s), bulk {})",
        h.name.value,
        h.tap.value,
        h.workers.value,
        h.bulk.value
    );
    let host = HostInfo { stats: hp.stats().clone() };
    let mut info = PortInfo::new(&h.name.value, DriverInfo::Host(host), h.workers.value, "io_uring".into());
    // Watched like an AF_XDP port's interface: a deleted TAP stops the port, named and counted.
    info.interface = Some(h.tap.value.clone());
    info.ifindex = ifindex;
    let queues = queues.into_iter().map(|q| vec![Box::new(q) as Box<dyn wasmswitch_core::PortQueue>]).collect();
    Ok(OpenedPort {
        info,
        queues,
        max_frame: max_frame(h.mtu.value),
        tx_max: max_frame(h.mtu.value),
        handle: Some(Box::new(hp)),
        l2: Default::default(),
        pool: ctx.pool.id(),
    })
}
