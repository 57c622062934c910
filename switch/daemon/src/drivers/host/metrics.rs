//! The host port's metrics: deliveries to the TAP and reads from it, by its host workers.

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::drivers::PortInfo;
use crate::prom::counter_family;

use super::HostInfo;

/// Writes the host port's families.
pub(crate) fn encode(e: &mut DescriptorEncoder, ports: &[(&PortInfo, &HostInfo)]) -> std::fmt::Result {
    for (info, h) in ports {
        let t = h.stats.totals();
        let l = || vec![("port", info.name.clone())];
        let host: [(&str, &str, u64); 13] = [
            ("wasmswitch_host_enqueued", "Frames queued for the host (per-destination bulk queues).", t.enqueued),
            ("wasmswitch_host_ring_full_drops", "Frames dropped because a host worker's ring was full.", t.ring_full),
            ("wasmswitch_host_delivered", "Frames written to the TAP by host workers.", t.delivered),
            ("wasmswitch_host_write_errors", "TAP writes that failed.", t.write_errors),
            (
                "wasmswitch_host_uring_submissions",
                "io_uring submissions by host workers (one per delivered list).",
                t.submissions,
            ),
            ("wasmswitch_host_wakeups", "Doorbells rung to wake a sleeping host worker.", t.wakeups),
            ("wasmswitch_tap_tx_packets", "Packets written to the TAP (towards the host stack).", t.tap_tx_packets),
            ("wasmswitch_tap_tx_bytes", "Bytes written to the TAP.", t.tap_tx_bytes),
            ("wasmswitch_tap_rx_packets", "Packets read from the TAP (sent by the host).", t.tap_rx_packets),
            ("wasmswitch_tap_rx_bytes", "Bytes read from the TAP.", t.tap_rx_bytes),
            ("wasmswitch_tap_read_errors", "TAP reads that failed.", t.read_errors),
            (
                "wasmswitch_tap_rx_ring_full_drops",
                "Frames from the host dropped because the ring to the datapath was full.",
                t.rx_ring_full,
            ),
            ("wasmswitch_tap_rx_alloc_failed", "TAP reads not posted for lack of a free frame.", t.rx_alloc_failed),
        ];
        for (name, help, v) in host {
            counter_family(e, name, help, &[(l(), v)])?;
        }
        // Delivered list sizes as a Prometheus histogram (buckets 1, 2, 4, ... 64, +Inf).
        let mut m = e.encode_descriptor(
            "wasmswitch_host_batch_size",
            "Frames per host delivery (one io_uring submission each).",
            None,
            MetricType::Histogram,
        )?;
        // Per-bucket counts, the encoder accumulates them; it writes only the buckets it is
        // given, so the `+Inf` one (which the format requires) is the last of them.
        let bounds = wasmswitch_tap::BATCH_BUCKETS.iter().map(|&b| b as f64).chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(t.batch_hist).collect();
        let batches = t.batch_hist.iter().sum();
        let labels = l();
        m.encode_family(&labels)?.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            t.batch_frames as f64,
            batches,
            &buckets,
            None,
        )?;
    }
    Ok(())
}
