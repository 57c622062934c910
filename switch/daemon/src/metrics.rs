//! Prometheus metrics: one collector that sums the per-worker single-writer counters at scrape
//! time (nothing on the datapath knows metrics exist).

use std::fmt::Write;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use wasmswitch_core::counter::Counter;
use wasmswitch_core::fdb::CurrentFdb;
use wasmswitch_core::pool::{PoolStats, SharedPool};

use crate::drivers::UmemGroup;
use wasmswitch_core::stats::{DropReason, WorkerStats};

use crate::drivers::PortTable;

/// Extra metric families contributed by other subsystems (plugins, host port).
pub trait MetricsSource: Send + Sync + std::fmt::Debug {
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result;
}

/// Everything the scrape reads.
#[derive(Debug)]
pub struct SwitchCollector {
    pub ports: PortTable,
    pub workers: Vec<Arc<WorkerStats>>,
    /// The UMEM groups' pools, by pool id.
    pub groups: Arc<[UmemGroup]>,
    pub fdb: Arc<CurrentFdb>,
    pub start: Instant,
    pub extra: Vec<Arc<dyn MetricsSource>>,
}

type Labels = Vec<(&'static str, String)>;
type Ports = [(wasmswitch_core::PortId, Arc<crate::drivers::PortInfo>)];

/// Writes one counter family: `name` gets `_total` appended by the encoder.
pub fn counter_family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, u64)],
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes one gauge family.
pub fn gauge_family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, i64)],
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl SwitchCollector {
    /// Per (port, worker) samples of one port counter.
    fn port_samples(&self, ports: &Ports, f: impl Fn(&wasmswitch_core::stats::PortStats) -> u64) -> Vec<(Labels, u64)> {
        let mut out = Vec::new();
        for (p, info) in ports {
            for w in &self.workers {
                let v = f(&w.ports[*p as usize]);
                out.push((vec![("port", info.name.clone()), ("worker", w.worker.to_string())], v));
            }
        }
        out
    }

    fn worker_samples(&self, f: impl Fn(&WorkerStats) -> u64) -> Vec<(Labels, u64)> {
        self.workers.iter().map(|w| (vec![("worker", w.worker.to_string())], f(w))).collect()
    }

    fn pool_counter(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        f: fn(&PoolStats) -> &Counter,
    ) -> std::fmt::Result {
        counter_family(enc, name, help, &self.worker_samples(|w| f(&w.pool).get()))
    }
}

impl Collector for SwitchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut enc;
        // One snapshot per scrape: a reload may add or remove ports meanwhile.
        let ports = self.ports.snapshot();
        // Drops read before the packets received: a worker counts a batch's packets before it
        // drops any of them, so one scrape never shows a port dropping more of what it received
        // than it received (`tx_ring_full` and `egress_mtu_exceeded` count at the egress port,
        // of others' packets).
        let mut drops = Vec::new();
        for (p, info) in &ports {
            for r in DropReason::ALL {
                let v: u64 = self.workers.iter().map(|w| w.ports[*p as usize].drops[r as usize].get()).sum();
                drops.push((vec![("port", info.name.clone()), ("reason", r.label().to_string())], v));
            }
        }
        counter_family(
            e,
            "wasmswitch_port_rx_packets",
            "Packets received, per port and worker.",
            &self.port_samples(&ports, |s| s.rx_packets.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_rx_bytes",
            "Bytes received, per port and worker.",
            &self.port_samples(&ports, |s| s.rx_bytes.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_tx_packets",
            "Packets transmitted, per port and worker.",
            &self.port_samples(&ports, |s| s.tx_packets.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_tx_bytes",
            "Bytes transmitted, per port and worker.",
            &self.port_samples(&ports, |s| s.tx_bytes.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_checksums_completed",
            "TCP/UDP checksums completed on ingress because the sender left them to offload.",
            &self.port_samples(&ports, |s| s.checksums_completed.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_link_local",
            "Link-local frames (01:80:C2:00:00:0X) received: never forwarded, given to the host port.",
            &self.port_samples(&ports, |s| s.link_local.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_own_address",
            "Frames received with the host port's MAC as source (not on the host port): forwarded, never learned.",
            &self.port_samples(&ports, |s| s.own_address.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_fdb_learn_refused",
            "Frames whose new source address was not learned: the port had fdb.max_macs learned entries (forwarded all the same; once per run of one source in a batch).",
            &self.port_samples(&ports, |s| s.learn_refused.get()),
        )?;
        let fdb = self.fdb.get();
        gauge_family(
            e,
            "wasmswitch_port_fdb_learned",
            "Learned FDB entries on the port (static ones not counted): what fdb.max_macs limits.",
            &ports
                .iter()
                .map(|(p, info)| (vec![("port", info.name.clone())], fdb.learned_on(*p) as i64))
                .collect::<Vec<_>>(),
        )?;
        counter_family(
            e,
            "wasmswitch_port_drops",
            "Packets dropped, by port and reason (ingress port; tx_ring_full and egress_mtu_exceeded count on the egress port).",
            &drops,
        )?;
        let mut missed = Vec::new();
        for (_, info) in &ports {
            for q in 0..info.sim.len() {
                missed.push((vec![("port", info.name.clone()), ("queue", q.to_string())], info.sim_missed(q)));
            }
        }
        counter_family(
            e,
            "wasmswitch_sim_rx_missed",
            "Packets a sim NIC queue could not receive (fill ring empty).",
            &missed,
        )?;
        type Pick = fn(&wasmswitch_afxdp::QueueStats) -> u64;
        let afxdp: [(&str, &str, Pick); 8] = [
            ("wasmswitch_afxdp_rx_ring_empty", "RX bursts that found the AF_XDP RX ring empty.", |q| {
                q.rx_ring_empty.get()
            }),
            ("wasmswitch_afxdp_fill_starved", "Fill ring refills that found the pool empty.", |q| q.fill_starved.get()),
            ("wasmswitch_afxdp_rx_wakeups", "recvfrom wakeups asked for by the fill ring (need_wakeup).", |q| {
                q.rx_wakeups.get()
            }),
            ("wasmswitch_afxdp_tx_wakeups", "sendto kicks asked for by the TX ring (need_wakeup).", |q| {
                q.tx_wakeups.get()
            }),
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
            for (_, info) in &ports {
                for m in &info.afxdp {
                    samples.push((vec![("port", info.name.clone()), ("queue", m.queue.to_string())], pick(&m.stats)));
                }
            }
            counter_family(e, name, help, &samples)?;
        }
        // Which worker polls each queue, for joins (a worker whose own RX ring overflows while
        // it forwards nothing is stalled; one without traffic is only idle).
        let mut owners = Vec::new();
        for (_, info) in &ports {
            for (i, m) in info.afxdp.iter().enumerate() {
                let w = crate::drivers::afxdp::worker_of_queue(i, self.workers.len());
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
            .flat_map(|(_, info)| info.afxdp.iter().map(move |m| (info, m.queue, m.xdp_stats())))
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
        // The interface's own drop counters (veth: a full peer ring or backlog), from sysfs.
        // Not read while the port is gone: an interface of that name then may be a new one.
        let mut ifdrops = Vec::new();
        for (_, info) in &ports {
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
        for (_, info) in ports.iter().filter(|(_, i)| i.interface.is_some()) {
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
        for (_, info) in &ports {
            let Some(ifname) = &info.interface else { continue };
            let count = &info.kernel_drops.veth_peer;
            if info.gone.load(std::sync::atomic::Ordering::Relaxed) {
                // Held at its last value while gone (only veth ports ever had one).
                if count.held() > 0 {
                    peer_drops.push((vec![("port", info.name.clone())], count.held()));
                }
                continue;
            }
            let ifindex = wasmswitch_afxdp::sys::ifindex(ifname);
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
        for (_, info) in &ports {
            let Some(tap) = &info.tap else { continue };
            let t = tap.totals();
            let l = || vec![("port", info.name.clone())];
            let host: [(&str, &str, u64); 13] = [
                ("wasmswitch_host_enqueued", "Frames queued for the host (per-destination bulk queues).", t.enqueued),
                (
                    "wasmswitch_host_ring_full_drops",
                    "Frames dropped because a host worker's ring was full.",
                    t.ring_full,
                ),
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
        let info: Vec<(Labels, i64)> = ports
            .iter()
            .map(|(_, p)| {
                (
                    vec![
                        ("port", p.name.clone()),
                        ("driver", p.driver.to_string()),
                        ("mode", p.mode.clone()),
                        ("queues", p.queues.to_string()),
                        ("umem", p.umem.clone()),
                    ],
                    1,
                )
            })
            .collect();
        gauge_family(e, "wasmswitch_port_info", "Port driver and mode (value is always 1).", &info)?;

        self.pool_counter(e, "wasmswitch_pool_alloc_fast", "Frames allocated from the worker's cache.", |p| {
            &p.alloc_fast
        })?;
        self.pool_counter(e, "wasmswitch_pool_alloc_refill", "Cache refills (bulk) from the recycle ring.", |p| {
            &p.alloc_refill
        })?;
        self.pool_counter(e, "wasmswitch_pool_alloc_slow", "Cache refills from the release list (ring empty).", |p| {
            &p.alloc_slow
        })?;
        self.pool_counter(e, "wasmswitch_pool_alloc_empty", "Refills that found the recycle ring empty.", |p| {
            &p.alloc_empty
        })?;
        self.pool_counter(e, "wasmswitch_pool_alloc_failed", "Allocations that found no frame anywhere.", |p| {
            &p.alloc_failed
        })?;
        self.pool_counter(e, "wasmswitch_pool_recycle_cached", "Frames returned straight into a worker cache.", |p| {
            &p.recycle_cached
        })?;
        self.pool_counter(e, "wasmswitch_pool_recycle_cache_full", "Returns that found the worker cache full.", |p| {
            &p.recycle_cache_full
        })?;
        self.pool_counter(e, "wasmswitch_pool_recycle_ring", "Frames returned to the recycle ring.", |p| {
            &p.recycle_ring
        })?;
        self.pool_counter(e, "wasmswitch_pool_recycle_ring_full", "Returns that found the recycle ring full.", |p| {
            &p.recycle_ring_full
        })?;
        self.pool_counter(
            e,
            "wasmswitch_pool_recycle_released",
            "Frames sent to the release list (ring full).",
            |p| &p.recycle_released,
        )?;
        let per_group = |f: &dyn Fn(&SharedPool) -> usize| -> Vec<(Labels, i64)> {
            self.groups.iter().map(|g| (vec![("umem", g.name.clone())], f(&g.pool) as i64)).collect()
        };
        gauge_family(
            e,
            "wasmswitch_pool_frames",
            "Frames in the UMEM group's pool.",
            &per_group(&|p| p.total_frames()),
        )?;
        gauge_family(
            e,
            "wasmswitch_pool_frames_at_rest",
            "Frames in the UMEM group's shared recycle ring and release list.",
            &per_group(&|p| p.frames_at_rest()),
        )?;
        let cache: Vec<(Labels, i64)> =
            self.workers
                .iter()
                .flat_map(|w| {
                    self.groups.iter().zip(&w.cache_frames).map(|(g, c)| {
                        (vec![("worker", w.worker.to_string()), ("umem", g.name.clone())], c.get() as i64)
                    })
                })
                .collect();
        gauge_family(e, "wasmswitch_pool_cache_frames", "Frames in a worker's alloc cache of the UMEM group.", &cache)?;

        gauge_family(
            e,
            "wasmswitch_fdb_entries",
            "MAC addresses in the forwarding database.",
            &[(vec![], self.fdb.get().len() as i64)],
        )?;
        gauge_family(
            e,
            "wasmswitch_fdb_statics",
            "Static entries in the forwarding database (at most half its capacity, six of each bucket's eight slots).",
            &[(vec![], self.fdb.get().statics() as i64)],
        )?;
        gauge_family(
            e,
            "wasmswitch_fdb_capacity",
            "Forwarding database capacity.",
            &[(vec![], self.fdb.get().capacity() as i64)],
        )?;
        counter_family(
            e,
            "wasmswitch_fdb_learned",
            "MAC addresses learned.",
            &self.worker_samples(|w| w.fdb_learned.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_fdb_moved",
            "MAC addresses that moved to another port.",
            &self.worker_samples(|w| w.fdb_moved.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_fdb_evicted",
            "Entries evicted from a full FDB bucket.",
            &self.worker_samples(|w| w.fdb_evicted.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_fdb_not_learned",
            "Frames whose source was not learned: another worker was rewriting the entry at that instant (a later frame learns it). A port's limit counts in wasmswitch_port_fdb_learn_refused.",
            &self.worker_samples(|w| w.fdb_not_learned.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_fdb_aged",
            "Entries removed by aging.",
            &[(vec![], self.fdb.get().stats.aged.get())],
        )?;
        counter_family(
            e,
            "wasmswitch_fdb_resize_dropped",
            "Learned entries a reload to a smaller fdb.capacity had no room for (the stalest go).",
            &[(vec![], self.fdb.get().stats.resize_dropped.get())],
        )?;
        counter_family(
            e,
            "wasmswitch_flood_copies",
            "Frame copies made by flooding.",
            &self.worker_samples(|w| w.flood_copies.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_mirror_copies",
            "Frame copies made for port mirrors.",
            &self.worker_samples(|w| w.mirror_copies.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_umem_copies",
            "Frames copied into another UMEM group's frame to leave by a port of that group.",
            &self.worker_samples(|w| w.umem_copies.get()),
        )?;

        counter_family(
            e,
            "wasmswitch_worker_busy_cycles",
            "TSC cycles spent in rounds that moved packets (divide by packets for cycles/packet).",
            &self.worker_samples(|w| w.busy_cycles.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_worker_packets",
            "Packets processed by the worker.",
            &self.worker_samples(|w| w.packets.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_worker_batches",
            "Non-empty RX bursts processed by the worker.",
            &self.worker_samples(|w| w.batches.get()),
        )?;
        gauge_family(
            e,
            "wasmswitch_uptime_seconds",
            "Seconds since the datapath started.",
            &[(vec![], self.start.elapsed().as_secs() as i64)],
        )?;
        gauge_family(
            e,
            "wasmswitch_build_info",
            "The running build (value is always 1).",
            &[(
                vec![
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                    ("profile", if cfg!(debug_assertions) { "debug" } else { "release" }.to_string()),
                ],
                1,
            )],
        )?;
        for x in &self.extra {
            x.encode(e)?;
        }
        Ok(())
    }
}

/// A registry with the switch collector, rendered as Prometheus text.
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub fn new(collector: SwitchCollector) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(collector));
        Self { registry }
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry).is_err() {
            let _ = writeln!(out, "# metrics encoding failed");
        }
        out
    }
}
