//! An AF_XDP port's metrics: the driver's own counters per queue, which worker polls each
//! queue, and the kernel's per-socket statistics (one getsockopt per queue per scrape).

use prometheus_client::encoding::DescriptorEncoder;

use crate::drivers::PortInfo;
use crate::prom::{counter_family, gauge_family};

use super::AfxdpInfo;

/// Writes the afxdp driver's families over its `ports`, polled by `workers` workers.
pub(crate) fn encode(e: &mut DescriptorEncoder, ports: &[(&PortInfo, &AfxdpInfo)], workers: usize) -> std::fmt::Result {
    type Pick = fn(&wasmswitch_afxdp::QueueStats) -> u64;
    let afxdp: [(&str, &str, Pick); 8] = [
        ("wasmswitch_afxdp_rx_ring_empty", "RX bursts that found the AF_XDP RX ring empty.", |q| q.rx_ring_empty.get()),
        ("wasmswitch_afxdp_fill_starved", "Fill ring refills that found the pool empty.", |q| q.fill_starved.get()),
        ("wasmswitch_afxdp_rx_wakeups", "recvfrom wakeups asked for by the fill ring (need_wakeup).", |q| {
            q.rx_wakeups.get()
        }),
        ("wasmswitch_afxdp_tx_wakeups", "sendto kicks asked for by the TX ring (need_wakeup).", |q| q.tx_wakeups.get()),
        ("wasmswitch_afxdp_tx_kick_busy", "TX kicks answered EAGAIN/ENOBUFS (retried, nothing lost).", |q| {
            q.tx_kick_busy.get()
        }),
        (
            "wasmswitch_afxdp_tx_kernel_drops",
            "TX kicks answered EBUSY: the device refused a frame in copy mode and the kernel dropped it.",
            |q| q.tx_kernel_drops.get(),
        ),
        ("wasmswitch_afxdp_tx_kick_errors", "TX kicks answered with another error.", |q| q.tx_kick_errors.get()),
        ("wasmswitch_afxdp_port_gone", "TX kicks answered ENETDOWN/ENXIO (interface down or gone).", |q| {
            q.port_gone.get()
        }),
    ];
    for (name, help, pick) in afxdp {
        let mut samples = Vec::new();
        for (info, a) in ports {
            for m in &a.queues {
                samples.push((vec![("port", info.name.clone()), ("queue", m.queue.to_string())], pick(&m.stats)));
            }
        }
        counter_family(e, name, help, &samples)?;
    }
    // Which worker polls each queue, for joins (a worker whose own RX ring overflows while
    // it forwards nothing is stalled; one without traffic is only idle).
    let mut owners = Vec::new();
    for (info, a) in ports {
        for (i, m) in a.queues.iter().enumerate() {
            let w = super::worker_of_queue(i, workers);
            owners.push((
                vec![("port", info.name.clone()), ("queue", m.queue.to_string()), ("worker", w.to_string())],
                1,
            ));
        }
    }
    gauge_family(
        e,
        "wasmswitch_afxdp_queue_worker",
        "The worker that polls each AF_XDP queue (value always 1; join on port and queue).",
        &owners,
    )?;
    // The kernel's per-socket drop counters: one getsockopt per queue per scrape.
    let kernel: Vec<_> = ports
        .iter()
        .flat_map(|(info, a)| a.queues.iter().map(move |m| (info, m.queue, m.xdp_stats())))
        .filter_map(|(info, q, s)| Some((vec![("port", info.name.clone()), ("queue", q.to_string())], s?)))
        .collect();
    type KPick = fn(&wasmswitch_afxdp::XdpStatistics) -> u64;
    let kfams: [(&str, &str, KPick); 6] = [
        (
            "wasmswitch_afxdp_kernel_rx_dropped",
            "Frames the kernel dropped before the AF_XDP RX ring (XDP_STATISTICS rx_dropped).",
            |s| s.rx_dropped,
        ),
        (
            "wasmswitch_afxdp_kernel_rx_ring_full",
            "Frames dropped because the socket's RX ring was full (XDP_STATISTICS).",
            |s| s.rx_ring_full,
        ),
        (
            "wasmswitch_afxdp_kernel_rx_fill_ring_empty",
            "Times the kernel found the fill ring empty (XDP_STATISTICS rx_fill_ring_empty_descs).",
            |s| s.rx_fill_ring_empty_descs,
        ),
        ("wasmswitch_afxdp_kernel_rx_invalid_descs", "Invalid RX descriptors (XDP_STATISTICS).", |s| {
            s.rx_invalid_descs
        }),
        ("wasmswitch_afxdp_kernel_tx_invalid_descs", "Invalid TX descriptors (XDP_STATISTICS).", |s| {
            s.tx_invalid_descs
        }),
        (
            "wasmswitch_afxdp_kernel_tx_ring_empty",
            "Kicks that found the TX ring empty (XDP_STATISTICS tx_ring_empty_descs).",
            |s| s.tx_ring_empty_descs,
        ),
    ];
    for (name, help, pick) in kfams {
        let samples: Vec<_> = kernel.iter().map(|(l, s)| (l.clone(), pick(s))).collect();
        counter_family(e, name, help, &samples)?;
    }
    Ok(())
}
