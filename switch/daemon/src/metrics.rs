//! Prometheus metrics: one collector that sums the per-worker single-writer counters at scrape
//! time (nothing on the datapath knows metrics exist).

use std::fmt::Write;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use wasmswitch_core::counter::Counter;
use wasmswitch_core::fdb::CurrentFdb;
use wasmswitch_core::pool::{PoolStats, SharedPool};

use crate::drivers::UmemGroup;
use wasmswitch_core::stats::{DropReason, WorkerStats};

use crate::drivers::PortTable;
pub use crate::prom::{counter_family, gauge_family, Labels};

/// Extra metric families contributed by other subsystems (plugins, host port).
pub trait MetricsSource: Send + Sync + std::fmt::Debug {
    /// Writes its families into the scrape.
    fn encode(&self, enc: &mut DescriptorEncoder) -> std::fmt::Result;
}

/// Everything the scrape reads.
#[derive(Debug)]
pub struct SwitchCollector {
    /// The running ports.
    pub ports: PortTable,
    /// Each worker's counters, summed (or labelled by worker) at scrape time.
    pub workers: Vec<Arc<WorkerStats>>,
    /// The UMEM groups' pools, by pool id.
    pub groups: Arc<[UmemGroup]>,
    /// The MAC table, whose entries are counted at each scrape.
    pub fdb: Arc<CurrentFdb>,
    /// When the datapath started (`wasmswitch_uptime_seconds`).
    pub start: Instant,
    /// Families of other subsystems (plugins, host port), written after the switch's own.
    pub extra: Vec<Arc<dyn MetricsSource>>,
}

type Ports = [(wasmswitch_core::PortId, Arc<crate::drivers::PortInfo>)];

impl SwitchCollector {
    /// Per (port, worker) samples of one port counter.
    fn port_samples(&self, ports: &Ports, f: impl Fn(&wasmswitch_core::stats::PortStats) -> u64) -> Vec<(Labels, u64)> {
        let mut out = Vec::new();
        for (p, info) in ports {
            for w in &self.workers {
                let v = f(&w.ports[p.index()]);
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
        self.encode_ports(e, &ports)?;
        crate::drivers::encode_metrics(e, &ports, self.workers.len())?;
        self.encode_port_info(e, &ports)?;
        self.encode_pools(e)?;
        self.encode_fdb(e)?;
        self.encode_workers(e)?;
        for x in &self.extra {
            x.encode(e)?;
        }
        Ok(())
    }
}

impl SwitchCollector {
    /// The ports' own counters, per worker, and their drops by reason.
    fn encode_ports(&self, e: &mut DescriptorEncoder, ports: &Ports) -> std::fmt::Result {
        // Drops read before the packets received: a worker counts a batch's packets before it
        // drops any of them, so one scrape never shows a port dropping more of what it received
        // than it received (`tx_ring_full` and `egress_mtu_exceeded` count at the egress port,
        // of others' packets).
        let mut drops = Vec::new();
        for (p, info) in ports {
            for r in DropReason::ALL {
                let v: u64 = self.workers.iter().map(|w| w.ports[p.index()].drops[r as usize].get()).sum();
                drops.push((vec![("port", info.name.clone()), ("reason", r.label().to_string())], v));
            }
        }
        counter_family(
            e,
            "wasmswitch_port_rx_packets",
            "Packets received, per port and worker.",
            &self.port_samples(ports, |s| s.rx_packets.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_rx_bytes",
            "Bytes received, per port and worker.",
            &self.port_samples(ports, |s| s.rx_bytes.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_tx_packets",
            "Packets transmitted, per port and worker.",
            &self.port_samples(ports, |s| s.tx_packets.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_tx_bytes",
            "Bytes transmitted, per port and worker.",
            &self.port_samples(ports, |s| s.tx_bytes.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_checksums_completed",
            "TCP/UDP checksums completed on ingress because the sender left them to offload.",
            &self.port_samples(ports, |s| s.checksums_completed.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_link_local",
            "Link-local frames (01:80:C2:00:00:0X) received: never forwarded, given to the host port.",
            &self.port_samples(ports, |s| s.link_local.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_own_address",
            "Frames received with the host port's MAC as source (not on the host port): forwarded, never learned.",
            &self.port_samples(ports, |s| s.own_address.get()),
        )?;
        counter_family(
            e,
            "wasmswitch_port_fdb_learn_refused",
            "Frames whose new source address was not learned: the port had fdb.max_macs learned entries (forwarded all the same; once per run of one source in a batch).",
            &self.port_samples(ports, |s| s.learn_refused.get()),
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
        Ok(())
    }

    /// One `wasmswitch_port_info` sample per port: its driver, mode, queues and UMEM group.
    fn encode_port_info(&self, e: &mut DescriptorEncoder, ports: &Ports) -> std::fmt::Result {
        let info: Vec<(Labels, i64)> = ports
            .iter()
            .map(|(_, p)| {
                (
                    vec![
                        ("port", p.name.clone()),
                        ("driver", p.driver.kind().to_string()),
                        ("mode", p.mode.clone()),
                        ("queues", p.queues.to_string()),
                        ("umem", p.umem.clone()),
                    ],
                    1,
                )
            })
            .collect();
        gauge_family(e, "wasmswitch_port_info", "Port driver and mode (value is always 1).", &info)?;
        Ok(())
    }

    /// The pools: per-worker alloc and recycle counters, and the frames where they rest.
    fn encode_pools(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
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
        Ok(())
    }

    /// The FDB, and the copies flooding, mirrors and UMEM crossings make.
    fn encode_fdb(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
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
        Ok(())
    }

    /// The workers' busy cycles, packets and batches, uptime and the build.
    fn encode_workers(&self, e: &mut DescriptorEncoder) -> std::fmt::Result {
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
        Ok(())
    }
}

/// A registry with the switch collector, rendered as Prometheus text.
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// A registry holding `collector` alone.
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
