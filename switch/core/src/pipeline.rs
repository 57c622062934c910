//! One worker's run-to-completion pipeline.
//!
//! Per RX burst: parse and classify into a VLAN (ingress mirrors copy here) → verdict stage
//! (one call per burst) → L2 (learn, look up, flood within the VLAN, storm control, link-local
//! frames to the host) → each frame put in its egress port's VLAN form in place → one TX burst
//! per egress port (egress mirrors copy here) → completions back to the pool in bulk.
//! No allocation, lock or syscall per packet; drivers get one call per burst per queue.
//!
//! UMEM groups: every port draws its frames from one pool (its UMEM group, see
//! [`PortSlot::pool`]). A frame leaves by a port of its own group as it is, without a copy; a
//! frame bound for a port of another group is copied into a frame of that group first, and
//! its original goes back to its own pool. So everything staged for a port is in that port's
//! UMEM, and every frame goes back to the pool it came from.

use std::sync::Arc;

use crate::batch::{Batch, Desc, L2Header, BATCH_SIZE, DEFAULT_BATCH, NO_TAG};
use crate::counter::cycles;
use crate::fdb::{Fdb, Learned, Place};
use crate::pool::{AllocMode, BulkReturn, PoolCache, PoolId, MAX_POOLS};
use crate::port::{PortId, PortQueue};
use crate::stats::{DropReason, PortStats, WorkerStats};
use crate::umem::Umem;
use crate::verdict::{BatchView, Verdict, VerdictStage};
use crate::vlan::{FloodClass, PortL2, StormState};
use crate::wire::{self, ethernet, MacAddr};

/// How many frames ahead of the one it parses the parser prefetches a frame's first line.
const HEADER_AHEAD: usize = 4;

/// How many of a flood's copies have their frames prefetched (a switch of four ports makes two).
const FLOOD_PREFETCH: usize = 3;

/// How the worker forwards (the config's `switch.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize), serde(rename_all = "lowercase"))]
pub enum ForwardMode {
    /// Learning L2 switch (the default).
    #[default]
    L2,
    /// Every packet goes back out of the port it came in on, unparsed (a ceiling measurement).
    Passthrough,
    /// Every packet leaves by the paired port (`in ^ 1`: 0↔1, 2↔3, …), unparsed and without a
    /// lookup: the forwarding ceiling for a two-port topology (gen → switch → sink). A packet
    /// whose pair does not exist or is down is dropped as `NoEgress`.
    Cross,
}

/// A worker's view of one port.
pub struct PortSlot {
    /// The queues this worker owns on the port. The first carries the worker's TX; every queue
    /// whose `has_rx()` is true is polled for RX.
    pub queues: Vec<Box<dyn PortQueue>>,
    /// Frames longer than this are dropped as oversize.
    pub max_frame: usize,
    /// Frames longer than this are not sent on the port: dropped as `EgressMtuExceeded`, as the
    /// Linux bridge drops a frame over its egress port's MTU, instead of handed to a device
    /// that would drop them unseen (a veth admits less than `max_frame`, see the driver).
    pub tx_max: usize,
    /// Ingress verdict stage (the port's plugin chain).
    pub ingress: Option<Box<dyn VerdictStage>>,
    /// A stopped port neither receives nor transmits (vanished interface).
    pub up: bool,
    /// Queue index reported in metrics (that of the TX queue).
    pub queue_index: u16,
    /// Complete TCP/UDP checksums that the sender left to offload (see
    /// [`wire::checksum`]): on for ports whose frames can come from a local sender with
    /// `CHECKSUM_PARTIAL` (veth, virtual devices), off where frames come off a wire.
    pub complete_partial_checksums: bool,
    /// VLAN membership, storm limits and mirrors.
    pub l2: PortL2,
    /// This worker's storm-control window on the port.
    pub storm: StormState,
    /// The pool (UMEM group) the port's frames come from and leave from: an index into the
    /// pipeline's pools. Ports of one group forward to each other without copying.
    pub pool: PoolId,
}

/// One return buffer per pool: bulked (see [`PipelineOptions::bulk_return`]) or one frame at a time.
fn bulk_returns(pools: usize, bulked: bool) -> Vec<BulkReturn> {
    (0..pools).map(|_| if bulked { BulkReturn::new() } else { BulkReturn::single() }).collect()
}

impl PortSlot {
    /// An up port with no ingress stage, reporting queue 0, checksums left as they are, that
    /// sends what it would take in (`tx_max` is `max_frame`).
    /// A slot without queues is down: nothing could be sent on it.
    pub fn new(queues: Vec<Box<dyn PortQueue>>, max_frame: usize) -> Self {
        let up = !queues.is_empty();
        Self {
            queues,
            max_frame,
            tx_max: max_frame,
            ingress: None,
            up,
            queue_index: 0,
            complete_partial_checksums: false,
            l2: PortL2::default(),
            storm: StormState::default(),
            pool: PoolId(0),
        }
    }

    /// With `stage` as the port's ingress verdict stage (its plugin chain).
    pub fn with_ingress(self, stage: Option<Box<dyn VerdictStage>>) -> Self {
        Self { ingress: stage, ..self }
    }

    /// Sending at most `tx_max` bytes a frame (see [`PortSlot::tx_max`]).
    pub fn with_tx_max(self, tx_max: usize) -> Self {
        Self { tx_max, ..self }
    }

    /// Reporting its TX queue as `queue_index` in metrics.
    pub fn with_queue_index(self, queue_index: u16) -> Self {
        Self { queue_index, ..self }
    }

    /// Completing checksums left to offload on ingress, or not.
    pub fn with_checksum_completion(self, complete_partial_checksums: bool) -> Self {
        Self { complete_partial_checksums, ..self }
    }

    /// With VLAN membership, storm limits and mirrors `l2`.
    pub fn with_l2(self, l2: PortL2) -> Self {
        Self { l2, ..self }
    }

    /// In pool (UMEM group) `pool`.
    pub fn with_pool(self, pool: PoolId) -> Self {
        Self { pool, ..self }
    }

    /// The slot of an id no port has: down, no queues.
    pub fn absent() -> Self {
        Self::new(Vec::new(), 0)
    }

    /// Frames held by all of this slot's queues.
    pub fn frames_held(&self) -> usize {
        self.queues.iter().map(|q| q.frames_held()).sum()
    }
}

/// Options that shape a pipeline (mostly for benchmark ablations).
#[derive(Clone, Copy, Debug)]
pub struct PipelineOptions {
    /// How packets are forwarded: learning L2, or a ceiling measurement.
    pub mode: ForwardMode,
    /// Return TX completions 16 at a time (`true`) or one at a time (ablation).
    pub bulk_return: bool,
    /// Port that receives `host` verdicts and floods (the TAP), if any.
    pub host_port: Option<PortId>,
    /// The host port's own MAC: learned on the host port only, never from a frame another port
    /// receives with it as source (the Linux bridge protects its own address the same way).
    pub host_mac: Option<MacAddr>,
    /// Parse every frame down to L4 (`true`), or only as deep as someone looks (`false`: the
    /// Ethernet header and tags, unless the port has plugins or completes checksums). An
    /// ablation: what lazy parsing saves.
    pub parse_all: bool,
    /// Most packets taken from one queue per RX burst, i.e. per batch and per plugin call:
    /// 1 to [`BATCH_SIZE`] (a value outside is clamped into it). A bigger batch spreads each
    /// plugin call's fixed cost (some 3,800 instructions in wasmtime) and the per-batch work
    /// over more packets; a smaller one holds fewer frames per worker.
    pub batch: usize,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            mode: ForwardMode::L2,
            bulk_return: true,
            host_port: None,
            host_mac: None,
            parse_all: false,
            batch: DEFAULT_BATCH,
        }
    }
}

/// (port, queue index in its slot) of every queue to poll for RX.
/// A batch size the pipeline can take: 1..=[`BATCH_SIZE`].
fn clamp_batch(batch: usize) -> usize {
    batch.clamp(1, BATCH_SIZE)
}

fn rx_list(ports: &[PortSlot]) -> Vec<(PortId, usize)> {
    ports
        .iter()
        .enumerate()
        .flat_map(|(p, s)| {
            s.queues.iter().enumerate().filter(|(_, q)| q.has_rx()).map(move |(i, _)| (PortId::from_index(p), i))
        })
        .collect()
}

/// One worker: its ports, its pool caches (one per UMEM group), the shared FDB, its counters.
pub struct Pipeline {
    ports: Vec<PortSlot>,
    /// By pool id: `pools[i].id() == i`.
    pools: Vec<PoolCache>,
    fdb: Arc<Fdb>,
    stats: Arc<WorkerStats>,
    opts: PipelineOptions,
    batch: Batch,
    /// Per egress port, descriptors staged for this round's TX burst.
    staged: Vec<Vec<Desc>>,
    /// Per pool, frames to give back after the round (drops, originals of cross-group
    /// copies), returned in bulk.
    dropped: Vec<Vec<u64>>,
    /// (port, queue index in its slot) of every queue this worker polls for RX.
    rx_list: Vec<(PortId, usize)>,
    /// Per pool, TX completions on their way back to it; kept across rounds (empty between
    /// them), so each is bound to its pool once, not every round.
    bulks: Vec<BulkReturn>,
    /// Each pool's UMEM (`umems[i]` is `pools[i]`'s), held apart from the pools so a batch
    /// can read frames while it allocates; every frame access of the pipeline goes through it.
    umems: Vec<Arc<Umem>>,
    now: u32,
    /// `opts.host_mac` as [`Place::mac_bits`] compares it (`u64::MAX`, no MAC, without one).
    own_mac: u64,
}

impl Pipeline {
    /// A worker whose ports all draw from `pool` (one UMEM group, pool id 0).
    pub fn new(
        ports: Vec<PortSlot>,
        pool: PoolCache,
        fdb: Arc<Fdb>,
        stats: Arc<WorkerStats>,
        opts: PipelineOptions,
    ) -> Self {
        Self::with_pools(ports, vec![pool], fdb, stats, opts)
    }

    /// A worker with a cache on each of `pools` (one per UMEM group); `pools[i]` must be the
    /// cache of pool id `i`, and every port's [`PortSlot::pool`] one of them.
    ///
    /// # Panics
    /// If `pools` is empty, longer than [`MAX_POOLS`] or out of order, or a port names a pool
    /// that is not there.
    pub fn with_pools(
        ports: Vec<PortSlot>,
        pools: Vec<PoolCache>,
        fdb: Arc<Fdb>,
        stats: Arc<WorkerStats>,
        mut opts: PipelineOptions,
    ) -> Self {
        opts.batch = clamp_batch(opts.batch);
        assert!((1..=MAX_POOLS).contains(&pools.len()), "a pipeline has 1 to {MAX_POOLS} pools");
        for (i, p) in pools.iter().enumerate() {
            assert_eq!(p.id().index(), i, "pools must be given in pool id order");
        }
        let mut ports = ports;
        for p in &mut ports {
            assert!(p.pool.index() < pools.len(), "a port of pool {} that is not given", p.pool);
            // Nothing can be sent on a port without queues.
            p.up &= !p.queues.is_empty();
        }
        let n = ports.len();
        // Worst case per round: every packet of every RX burst floods to every port.
        let per_port = opts.batch * n.max(1);
        let umems: Vec<_> = pools.iter().map(|p| p.umem().clone()).collect();
        Self {
            rx_list: rx_list(&ports),
            staged: (0..n).map(|_| Vec::with_capacity(per_port)).collect(),
            dropped: pools.iter().map(|_| Vec::with_capacity(opts.batch * 2)).collect(),
            ports,
            pools,
            fdb,
            stats,
            opts,
            batch: Batch::default(),
            bulks: bulk_returns(umems.len(), opts.bulk_return),
            umems,
            now: 0,
            own_mac: opts.host_mac.map_or(u64::MAX, MacAddr::to_u64),
        }
    }

    /// Switches to a datapath variant the `sim` benchmark compares with the default: how pool
    /// caches allocate, whether returns are bulked, whether every frame is parsed. Before the
    /// first poll (the caches must be empty).
    pub fn set_variant(&mut self, alloc: AllocMode, bulk_return: bool, parse_all: bool) {
        for p in &mut self.pools {
            p.set_mode(alloc);
        }
        self.opts.bulk_return = bulk_return;
        self.opts.parse_all = parse_all;
        self.bulks = bulk_returns(self.umems.len(), bulk_return);
    }

    /// This worker's counters.
    pub fn stats(&self) -> &Arc<WorkerStats> {
        &self.stats
    }

    /// This worker's cache on each pool, by pool id.
    pub fn pools(&self) -> &[PoolCache] {
        &self.pools
    }

    /// This worker's view of each port, by port id (an absent slot where no port has the id).
    pub fn ports(&self) -> &[PortSlot] {
        &self.ports
    }

    /// Swaps the ingress stage of `port` (hot reload happens between rounds, never inside one);
    /// the new stage first takes over what it wants of the old one
    /// ([`VerdictStage::take_over`]).
    pub fn set_ingress(
        &mut self,
        port: PortId,
        mut stage: Option<Box<dyn VerdictStage>>,
    ) -> Option<Box<dyn VerdictStage>> {
        let slot = &mut self.ports[port.index()].ingress;
        if let (Some(new), Some(old)) = (stage.as_mut(), slot.as_mut()) {
            new.take_over(old.as_mut());
        }
        std::mem::replace(slot, stage)
    }

    /// The ingress stage of `port`, for control commands between rounds.
    pub fn ingress_mut(&mut self, port: PortId) -> Option<&mut (dyn VerdictStage + 'static)> {
        self.ports.get_mut(port.index())?.ingress.as_deref_mut()
    }

    /// Puts `slot` in as port `port` (a port added or replaced by a reload), between rounds.
    /// The port's counters on this worker start from zero when `fresh` (a new port; a
    /// replaced one keeps counting). A slot already there is released first and returned (see
    /// [`Pipeline::detach_port`]).
    pub fn attach_port(&mut self, port: PortId, mut slot: PortSlot, fresh: bool) -> Option<PortSlot> {
        let i = port.index();
        assert!(slot.pool.index() < self.pools.len(), "a port of pool {} that is not given", slot.pool);
        let mut old = self.detach_port(port);
        if !fresh {
            // A port reopened with new settings keeps the state of the plugins that stay.
            if let (Some(new), Some(was)) = (slot.ingress.as_mut(), old.as_mut().and_then(|o| o.ingress.as_mut())) {
                new.take_over(was.as_mut());
            }
        }
        if self.ports.len() <= i {
            self.ports.resize_with(i + 1, PortSlot::absent);
            let per_port = self.opts.batch * self.ports.len();
            self.staged.resize_with(self.ports.len(), Vec::new);
            for s in &mut self.staged {
                s.reserve(per_port.saturating_sub(s.len()));
            }
        }
        if fresh {
            if let Some(st) = self.stats.ports.get(i) {
                st.reset();
            }
        }
        self.ports[i] = PortSlot { up: slot.up && !slot.queues.is_empty(), ..slot };
        self.rebuild_rx_list();
        old
    }

    /// Takes port `port` out (a reload removed it): its completions are collected, every frame
    /// its queues hold goes back to the pool (frames the kernel still holds are returned when
    /// the driver closes the queue) and the id stays empty and down. The slot comes back for
    /// the caller to drop elsewhere: closing a socket or a plugin instance can take a while
    /// (`synchronize_net`), and a worker must not stall its other ports on it. Nothing is
    /// staged for it: staging happens within a round.
    pub fn detach_port(&mut self, port: PortId) -> Option<PortSlot> {
        let slot = self.ports.get_mut(port.index())?;
        let mut slot = std::mem::replace(slot, PortSlot::absent());
        self.release(slot.pool, &mut slot.queues);
        self.rebuild_rx_list();
        Some(slot).filter(|s| !s.queues.is_empty() || s.ingress.is_some())
    }

    /// Collects the completions of `queues` and returns every frame they hold to `pool`.
    fn release(&mut self, pool: PoolId, queues: &mut [Box<dyn PortQueue>]) {
        let pool = &mut self.pools[pool.index()];
        let mut bulk = if self.opts.bulk_return { BulkReturn::new() } else { BulkReturn::single() };
        for queue in queues.iter_mut() {
            queue.complete(pool, &mut bulk);
        }
        bulk.flush(pool);
        for queue in queues.iter_mut() {
            queue.release_all(pool);
        }
    }

    /// Uses `fdb` from the next round on (a reload resized the table).
    pub fn set_fdb(&mut self, fdb: Arc<Fdb>) {
        self.fdb = fdb;
    }

    /// Gives `port` new queues (its interface came back), keeping its stage and counters: the
    /// old queues are released as by [`Pipeline::detach_port`] and returned, and the port is up
    /// again when it has queues.
    pub fn replace_queues(&mut self, port: PortId, queues: Vec<Box<dyn PortQueue>>) -> Vec<Box<dyn PortQueue>> {
        let Some(slot) = self.ports.get_mut(port.index()) else { return queues };
        let mut old = std::mem::replace(&mut slot.queues, queues);
        slot.up = !slot.queues.is_empty();
        let pool = slot.pool;
        self.release(pool, &mut old);
        self.rebuild_rx_list();
        old
    }

    /// `port`'s VLANs, storm limits and mirrors from the next round on.
    pub fn set_l2(&mut self, port: PortId, l2: PortL2) {
        if let Some(p) = self.ports.get_mut(port.index()) {
            p.l2 = l2;
        }
    }

    /// Takes up to `batch` packets per RX burst from now on (clamped to 1..=[`BATCH_SIZE`]);
    /// the staging vectors grow here, between rounds, rather than on a packet.
    pub fn set_batch(&mut self, batch: usize) {
        self.opts.batch = clamp_batch(batch);
        let n = self.ports.len().max(1);
        for s in &mut self.staged {
            s.reserve(self.opts.batch * n);
        }
        for d in &mut self.dropped {
            d.reserve(self.opts.batch * 2);
        }
    }

    /// Frames longer than `max` bytes are dropped as oversize on `port`, and frames longer
    /// than `tx_max` are not sent there, from now on.
    pub fn set_max_frame(&mut self, port: PortId, max: usize, tx_max: usize) {
        if let Some(p) = self.ports.get_mut(port.index()) {
            p.max_frame = max;
            p.tx_max = tx_max;
        }
    }

    fn rebuild_rx_list(&mut self) {
        self.rx_list = rx_list(&self.ports);
    }

    /// Marks a port down (its interface vanished): no more RX or TX on it. A port without
    /// queues stays down.
    pub fn set_port_up(&mut self, port: PortId, up: bool) {
        if let Some(p) = self.ports.get_mut(port.index()) {
            p.up = up && !p.queues.is_empty();
        }
    }

    /// Sets the FDB clock (coarse ticks, normally seconds since start).
    pub fn set_now(&mut self, now: u32) {
        self.now = now;
    }

    /// One round: one RX burst from every polled queue, forwarding, TX and completions.
    /// Returns the number of packets received.
    pub fn poll(&mut self) -> usize {
        let start = cycles();
        let mut received = 0;
        let mut completed = 0;
        for i in 0..self.rx_list.len() {
            let (p, q) = self.rx_list[i];
            if self.ports[p.index()].up {
                received += self.rx_one(p, q);
                // Completions right after each burst's TX: frames come back to the cache while
                // the next burst's fill-ring refill still needs them, so the cache absorbs the
                // churn instead of overflowing to the shared ring once per round.
                completed += self.complete();
            }
        }
        if self.rx_list.is_empty() {
            completed += self.complete();
        }
        if received > 0 || completed > 0 {
            self.stats.busy_cycles.add(cycles().wrapping_sub(start));
        }
        for (gauge, pool) in self.stats.cache_frames.iter().zip(&self.pools) {
            gauge.set(pool.cached().len() as u64);
        }
        received
    }

    fn rx_one(&mut self, p: PortId, q: usize) -> usize {
        let pi = p.index();
        let g = self.ports[pi].pool;
        let n = self.ports[pi].queues[q].rx_burst(&mut self.pools[g.index()], &mut self.batch.descs[..self.opts.batch]);
        if n == 0 {
            return 0;
        }
        self.batch.len = n;
        let st = &self.stats.ports[pi];
        st.rx_packets.add(n as u64);
        st.rx_bytes.add(self.batch.descs[..n].iter().map(|d| d.len as u64).sum());
        self.stats.packets.add(n as u64);
        self.stats.batches.inc();

        match self.opts.mode {
            ForwardMode::Passthrough => {
                let Batch { descs, .. } = &self.batch;
                self.staged[pi].extend_from_slice(&descs[..n]);
            }
            ForwardMode::Cross => {
                let out = pi ^ 1;
                if out < self.ports.len() && self.ports[out].up {
                    if self.ports[out].pool == g {
                        self.staged[out].extend_from_slice(&self.batch.descs[..n]);
                    } else {
                        for i in 0..n {
                            let f = Frame { d: self.batch.descs[i], vlan: 0, tag: NO_TAG, pool: g };
                            if let Some(f) = self.copy_into_pool_of(pi, out, f) {
                                self.staged[out].push(f.d);
                            }
                        }
                    }
                } else {
                    for i in 0..n {
                        self.drop_frame(pi, g, self.batch.descs[i].addr, DropReason::NoEgress);
                    }
                }
            }
            ForwardMode::L2 => {
                self.parse_batch(p);
                if self.batch.len > 0 {
                    self.verdicts(p);
                    self.forward(p);
                }
            }
        }
        self.transmit();
        n
    }

    /// Parses the batch in place, compacting out (and counting) frames that fail to parse or
    /// that the port's VLANs do not admit, copies each parsed frame to the port's ingress
    /// mirrors (as received), sets each frame's VLAN (in `meta.vlan` too where metadata is kept), and
    /// completes offloaded checksums where the port asks for it (before any plugin, so plugins
    /// see the frame as it will leave). Parsing stops after the Ethernet header and tags on a
    /// port without plugins or checksums to complete: nothing past them is read there, so a
    /// malformed IP header is only dropped where something would look at it, and no metadata
    /// is written (the L2 stage takes the addresses, the VLAN and the tag, in `Batch::l2`).
    fn parse_batch(&mut self, p: PortId) {
        let slot = &self.ports[p.index()];
        if slot.complete_partial_checksums
            || slot.ingress.is_some()
            || self.opts.parse_all
            || !slot.l2.mirror_ingress.is_empty()
        {
            self.parse_batch_inspected(p);
        } else {
            self.parse_batch_as::<true>(p);
        }
    }

    /// [`Pipeline::parse_batch`] of a port whose frames something inspects: a function of its
    /// own, one call per batch, so that its longer loop does not shape the plain port's code.
    #[inline(never)]
    fn parse_batch_inspected(&mut self, p: PortId) {
        self.parse_batch_as::<false>(p);
    }

    /// [`Pipeline::parse_batch`], for a `PLAIN` port (no verdict stage, no checksums to complete,
    /// no ingress mirror) compiled without the tests of those.
    #[inline(always)]
    fn parse_batch_as<const PLAIN: bool>(&mut self, p: PortId) {
        let pi = p.index();
        let slot = &self.ports[pi];
        let g = slot.pool.index();
        // A reference, not a clone: the `Arc` is shared by every worker, and its count's cache
        // line would bounce between them once per batch.
        let umem: &Umem = &self.umems[g];
        let max = slot.max_frame;
        let fix_checksums = !PLAIN && slot.complete_partial_checksums;
        let deep = !PLAIN && (fix_checksums || slot.ingress.is_some() || self.opts.parse_all);
        // Only a verdict stage's port reads verdicts (see `forward_bridged`).
        let staged_verdicts = !PLAIN && slot.ingress.is_some();
        let l2 = &slot.l2;
        let mirrors = !PLAIN && !l2.mirror_ingress.is_empty();
        let st = &self.stats.ports[pi];
        let fdb = &*self.fdb;
        let b = &mut self.batch;
        let mut kept = 0;
        let mut completed = 0;
        for i in b.indices() {
            // Past the batch's end this reads an older burst's descriptor: a harmless hint, and
            // no test per packet.
            umem.prefetch(b.descs[(i + HEADER_AHEAD) % BATCH_SIZE].addr);
            let d = b.descs[i];
            // SAFETY: the descriptor came from this worker's RX burst, so the worker holds the
            // frame and nothing else reads or writes it while this slice lives.
            let bytes = unsafe { umem.bytes_mut(d.addr, d.len as usize) };
            // A length beyond the frame reads as an empty slice, i.e. a runt; one over `max` is
            // oversize (the parser's first test). Metadata is only kept where something reads
            // it (`deep`); the L2 stage needs the outer C-tag only.
            let parsed = if deep {
                let m = &mut b.meta[kept];
                wire::parse_l2_into(bytes, max, m).and_then(|l3| wire::parse_l3_into(bytes, l3, m)).map(|()| m.ctag())
            } else {
                wire::parse_l2(bytes, max).map(|eth| eth.ctag())
            }
            .map_err(DropReason::from);
            if mirrors && parsed.is_ok() {
                for &m in &l2.mirror_ingress {
                    if let Some(mp) = self.ports.get(m.index()).filter(|s| s.up).map(|s| s.pool.index()) {
                        match duplicate(umem, &mut self.pools[mp], d) {
                            Some(addr) => {
                                self.staged[m.index()].push(d.copy_at(addr));
                                self.stats.mirror_copies.inc();
                            }
                            None => st.drop(DropReason::PoolEmpty),
                        }
                    }
                }
            }
            let parsed = parsed.and_then(|tag| {
                // Always there once the header parsed.
                let (dst, src) = ethernet::addr_bits(bytes).ok_or(DropReason::Runt)?;
                match l2.vlan.classify(tag) {
                    Some(v) => {
                        if deep {
                            b.meta[kept].vlan = v.get();
                        }
                        let (src, dst) = (fdb.place_bits(v, src), fdb.place_bits(v, dst));
                        fdb.prefetch(dst);
                        fdb.prefetch(src);
                        b.l2[kept] = L2Header::new(src, dst, v, tag);
                        Ok(())
                    }
                    None if l2.mirror_destination => Err(DropReason::MirrorDestination),
                    None => Err(DropReason::VlanFiltered),
                }
            });
            match parsed {
                Ok(()) => {
                    if fix_checksums
                        && wire::checksum::complete_partial(bytes, &b.meta[kept])
                            == wire::checksum::Completion::Completed
                    {
                        completed += 1;
                    }
                    // A plain port's frames move only once a frame before them was dropped.
                    if !PLAIN || kept != i {
                        b.descs[kept] = d;
                    }
                    if staged_verdicts {
                        b.verdicts[kept] = Verdict::Pass;
                    }
                    kept += 1;
                }
                Err(reason) => {
                    st.drop(reason);
                    self.dropped[g].push(d.addr);
                }
            }
        }
        if completed > 0 {
            st.checksums_completed.add(completed);
        }
        b.len = kept;
    }

    fn verdicts(&mut self, p: PortId) {
        let pi = p.index();
        let queue = self.ports[pi].queue_index;
        let umem = &self.umems[self.ports[pi].pool.index()];
        let Some(stage) = self.ports[pi].ingress.as_mut() else { return };
        let b = &mut self.batch;
        let view = BatchView { in_port: p, queue, umem, descs: &b.descs[..b.len], meta: &b.meta[..b.len] };
        stage.run(&view, &mut b.verdicts[..b.len]);
    }

    fn forward(&mut self, p: PortId) {
        let pi = p.index();
        if self.ports[pi].ingress.is_none() {
            self.forward_bridged(p);
            return;
        }
        let g = self.ports[pi].pool;
        let nports = self.ports.len();
        let guarded = self.guarded_mac(p);
        let mut last_src = Place::default();
        for i in self.batch.indices() {
            let d = self.batch.descs[i];
            let h = self.batch.l2[i];
            let f = Frame { d, vlan: h.vlan(), tag: h.tag_raw(), pool: g };
            let egress = match self.batch.verdicts[i] {
                Verdict::Drop => {
                    self.drop_frame(pi, g, d.addr, DropReason::Policy);
                    continue;
                }
                Verdict::Redirect(q) => {
                    if q.index() < nports && self.ports[q.index()].up {
                        self.send(pi, q.index(), f);
                    } else {
                        self.drop_frame(pi, g, d.addr, DropReason::BadRedirect);
                        if let Some(stage) = self.ports[pi].ingress.as_mut() {
                            stage.bad_redirect(i, q);
                        }
                    }
                    continue;
                }
                Verdict::Host => {
                    match self.opts.host_port {
                        Some(h) if self.ports[h.index()].up => self.send(pi, h.index(), f),
                        _ => self.drop_frame(pi, g, d.addr, DropReason::NoEgress),
                    }
                    continue;
                }
                Verdict::HostCopy => {
                    match self.opts.host_port {
                        Some(h) if h != p && self.ports[h.index()].up => self.copy_to(pi, h.index(), f),
                        // No host to copy to: the original still forwards, nothing is lost.
                        _ => {}
                    }
                    self.l2_lookup(p, h, guarded, &mut last_src)
                }
                Verdict::Pass => self.l2_lookup(p, h, guarded, &mut last_src),
            };
            self.deliver(p, f, egress);
        }
    }

    /// [`Pipeline::forward`] for a port without a verdict stage, where every verdict is
    /// `Pass`: the parser writes no verdicts for it and this loop reads none.
    fn forward_bridged(&mut self, p: PortId) {
        let g = self.ports[p.index()].pool;
        let guarded = self.guarded_mac(p);
        let mut last_src = Place::default();
        for i in self.batch.indices() {
            let h = self.batch.l2[i];
            let egress = self.l2_lookup(p, h, guarded, &mut last_src);
            let f = Frame { d: self.batch.descs[i], vlan: h.vlan(), tag: h.tag_raw(), pool: g };
            self.deliver(p, f, egress);
        }
    }

    /// Sends (or drops, or floods) a frame received on `p` as the L2 lookup decided.
    #[inline(always)]
    fn deliver(&mut self, p: PortId, f: Frame, egress: Egress) {
        let pi = p.index();
        match egress {
            Egress::Drop(reason) => self.drop_frame(pi, f.pool, f.d.addr, reason),
            Egress::Port(q) if q == p => self.drop_frame(pi, f.pool, f.d.addr, DropReason::Hairpin),
            Egress::Port(q) if self.ports[q.index()].up => {
                if self.ports[q.index()].l2.vlan.members.contains(f.vlan) {
                    self.send(pi, q.index(), f);
                } else {
                    // A static entry (or a reload) points outside the VLAN.
                    self.drop_frame(pi, f.pool, f.d.addr, DropReason::VlanFiltered);
                }
            }
            // Learned on a port that is down: flood instead (it may have moved).
            Egress::Port(_) => self.flood_limited(p, f, FloodClass::UnknownUnicast),
            Egress::Flood(class) => self.flood_limited(p, f, class),
            Egress::LinkLocal => {
                self.stats.ports[pi].link_local.inc();
                match self.opts.host_port {
                    Some(h) if h != p && self.ports[h.index()].up => self.send(pi, h.index(), f),
                    _ => self.drop_frame(pi, f.pool, f.d.addr, DropReason::LinkLocal),
                }
            }
        }
    }

    /// The source MAC a frame received on `p` must not teach the FDB: the host's own address,
    /// on every port but the host port (as [`Place::mac_bits`] gives it; `u64::MAX`, which no
    /// MAC is, for none).
    fn guarded_mac(&self, p: PortId) -> u64 {
        if Some(p) == self.opts.host_port {
            u64::MAX
        } else {
            self.own_mac
        }
    }

    /// Learns the source at `at.src` and looks the destination at `at.dst` up. `guarded` is
    /// [`Pipeline::guarded_mac`] of `p`, worked out once per batch.
    #[inline(always)]
    fn l2_lookup(&mut self, p: PortId, at: L2Header, guarded: u64, last_src: &mut Place) -> Egress {
        // Consecutive packets of one flow share a source and VLAN: learn once per run of them.
        let (src, dst) = (at.src(), at.dst());
        if !src.same_address(*last_src) {
            // The bridge's `is_valid_ether_addr`: a group or all-zero source is no station;
            // nothing is learned or forwarded from one. Checked per run of a source, like the
            // learn (a bad source is never `last_src`, so each of its frames is checked).
            if !src.is_station() {
                return Egress::Drop(DropReason::BadSource);
            }
            if src.mac_bits() == guarded {
                // The host's own address from another port: forwarded, never learned (it
                // would pull the host's traffic to that port); counted per frame.
                self.stats.ports[p.index()].own_address.inc();
            } else {
                *last_src = src;
                match self.fdb.learn_at(src, p, self.now) {
                    Learned::Known => {}
                    Learned::Full | Learned::Busy => self.stats.fdb_not_learned.inc(),
                    // Once per run of the source, as every learn: a flood of new addresses at
                    // the limit costs a read of the port's count each (the slow path).
                    Learned::Limited => self.stats.ports[p.index()].learn_refused.inc(),
                    Learned::New => self.stats.fdb_learned.inc(),
                    Learned::Moved => self.stats.fdb_moved.inc(),
                    Learned::Evicted => {
                        self.stats.fdb_learned.inc();
                        self.stats.fdb_evicted.inc();
                    }
                }
            }
        }
        if !dst.is_group() {
            return match self.fdb.lookup_at(dst) {
                Some(q) => Egress::Port(q),
                None => Egress::Flood(FloodClass::UnknownUnicast),
            };
        }
        let dst = MacAddr::from_u64(dst.mac_bits());
        if dst == MacAddr::BROADCAST {
            Egress::Flood(FloodClass::Broadcast)
        } else if dst.is_link_local() {
            Egress::LinkLocal
        } else {
            Egress::Flood(FloodClass::Multicast)
        }
    }

    /// Floods `f` unless the ingress port's storm control has used up `class` for this second.
    fn flood_limited(&mut self, p: PortId, f: Frame, class: FloodClass) {
        let pi = p.index();
        let slot = &mut self.ports[pi];
        if slot.storm.admit(&slot.l2.storm, class, self.now) {
            self.flood(p, f);
        } else {
            self.drop_frame(pi, f.pool, f.d.addr, DropReason::Storm);
        }
    }

    /// Sends `f` to every up port of its VLAN except `p`: a copy to each but the last, which
    /// gets the original (copies are taken before the original is reshaped for its port).
    fn flood(&mut self, p: PortId, f: Frame) {
        let pi = p.index();
        let member = |q: usize, s: &PortSlot| q != pi && s.up && s.l2.vlan.members.contains(f.vlan);
        // The copies (those in the frame's own group) take the frames on top of its pool's
        // cache: their lines start loading while the members are found.
        let pool = &self.pools[f.pool.index()];
        pool.prefetch_next(FLOOD_PREFETCH, pool.umem().frame_offset(f.d.addr));
        // One pass: each member found sends a copy to the one found before it.
        let mut prev = None;
        for q in 0..self.ports.len() {
            if member(q, &self.ports[q]) {
                if let Some(earlier) = prev.replace(q) {
                    self.copy_to(pi, earlier, f);
                }
            }
        }
        match prev {
            Some(last) => self.send(pi, last, f),
            None => self.drop_frame(pi, f.pool, f.d.addr, DropReason::NoEgress),
        }
    }

    /// Stages `f` for port `q`, reshaped in place for `q`'s VLAN form (after a copy into `q`'s
    /// UMEM group if it is of another).
    #[inline(always)]
    fn send(&mut self, ingress: usize, q: usize, f: Frame) {
        if self.ports[q].pool != f.pool {
            self.send_across(ingress, q, f);
            return;
        }
        self.stage(ingress, q, f);
    }

    /// [`Pipeline::send`] for a frame already in `q`'s UMEM group.
    #[inline(always)]
    fn stage(&mut self, ingress: usize, q: usize, f: Frame) {
        let untagged = self.ports[q].l2.vlan.untagged(f.vlan);
        if leaves_as_is(f.tag, untagged) {
            self.staged[q].push(f.d);
        } else {
            self.send_reshaped(ingress, q, f, untagged);
        }
    }

    #[inline(never)]
    fn send_reshaped(&mut self, ingress: usize, q: usize, f: Frame, untagged: bool) {
        match egress_form(&self.umems[f.pool.index()], f, untagged) {
            Some(d) => self.staged[q].push(d),
            None => self.drop_frame(ingress, f.pool, f.d.addr, DropReason::NoHeadroom),
        }
    }

    /// [`Pipeline::send`] for a frame of another UMEM group than `q`'s: the copy goes. Out of
    /// line, so that a switch of one group (which never takes it) keeps `send` small.
    #[inline(never)]
    fn send_across(&mut self, ingress: usize, q: usize, f: Frame) {
        if let Some(f) = self.copy_into_pool_of(ingress, q, f) {
            self.send(ingress, q, f);
        }
    }

    /// `f` copied into a frame of `q`'s pool, its original given back to its own pool; `None`
    /// (the original dropped as `PoolEmpty`) when `q`'s pool has no frame.
    fn copy_into_pool_of(&mut self, ingress: usize, q: usize, f: Frame) -> Option<Frame> {
        let Some(copy) = self.copy_for(q, f) else {
            self.drop_frame(ingress, f.pool, f.d.addr, DropReason::PoolEmpty);
            return None;
        };
        self.stats.umem_copies.inc();
        self.dropped[f.pool.index()].push(f.d.addr);
        Some(copy)
    }

    /// Stages a copy of `f` (in a fresh frame of `q`'s pool) for port `q`, in `q`'s VLAN form.
    fn copy_to(&mut self, ingress: usize, q: usize, f: Frame) {
        let to = self.ports[q].pool;
        let Some(addr) = duplicate(&self.umems[f.pool.index()], &mut self.pools[to.index()], f.d) else {
            self.stats.ports[ingress].drop(DropReason::PoolEmpty);
            return;
        };
        self.stats.flood_copies.inc();
        // `stage` written out: the copy's descriptor goes from registers to the staged ring.
        // Through a `Frame` it was built on the stack and read back whole, and that read
        // stalled on the narrower stores just made (half of `copy_to`'s time in perf).
        let untagged = self.ports[q].l2.vlan.untagged(f.vlan);
        let d = f.d.copy_at(addr);
        if leaves_as_is(f.tag, untagged) {
            self.staged[q].push(d);
        } else {
            self.send_reshaped(ingress, q, Frame { d, pool: to, ..f }, untagged);
        }
    }

    /// A copy of `f` in a fresh frame of `q`'s pool (whichever group `f` is in); `None` when
    /// that pool has no frame.
    #[inline]
    fn copy_for(&mut self, q: usize, f: Frame) -> Option<Frame> {
        let to = self.ports[q].pool;
        let addr = duplicate(&self.umems[f.pool.index()], &mut self.pools[to.index()], f.d)?;
        Some(Frame { d: f.d.copy_at(addr), pool: to, ..f })
    }

    /// Drops a frame of `pool` received on port `ingress`, counted there.
    #[inline]
    fn drop_frame(&mut self, ingress: usize, pool: PoolId, addr: u64, reason: DropReason) {
        self.stats.ports[ingress].drop(reason);
        self.dropped[pool.index()].push(addr);
    }

    /// One TX burst per egress port with staged frames; what a full ring refuses is dropped.
    /// Egress mirrors copy what their source ports are about to send first.
    fn transmit(&mut self) {
        self.mirror_egress();
        for q in 0..self.staged.len() {
            if self.staged[q].is_empty() {
                continue;
            }
            let staged = &mut self.staged[q];
            let port = &mut self.ports[q];
            // Everything staged for a port is in the port's own pool (see the module doc).
            let pool = port.pool.index();
            let st = &self.stats.ports[q];
            // One pass without a branch per frame; the frames go only when one is too long.
            if staged.iter().fold(0, |m, d| m.max(d.len)) as usize > port.tx_max {
                drop_too_long(staged, port.tx_max, st, &mut self.dropped[pool]);
            }
            let sent = if port.up { port.queues[0].tx_burst(staged) } else { 0 };
            st.tx_packets.add(sent as u64);
            st.tx_bytes.add(staged[..sent].iter().map(|d| d.len as u64).sum());
            if sent < staged.len() {
                // Counted on the egress port: the ingress port may be any of several.
                for _ in sent..staged.len() {
                    st.drop(DropReason::TxFull);
                }
                self.dropped[pool].extend(staged[sent..].iter().map(|d| d.addr));
            }
            port.queues[0].flush_tx();
            self.staged[q].clear();
        }
        for (dropped, pool) in self.dropped.iter_mut().zip(&mut self.pools) {
            if !dropped.is_empty() {
                pool.put_bulk(dropped);
                dropped.clear();
            }
        }
    }

    /// Copies every frame staged on a port with egress mirrors to the mirrors' destinations (a
    /// destination is never a source, see the config's checks, so nothing is copied twice).
    fn mirror_egress(&mut self) {
        for q in 0..self.ports.len() {
            if self.ports[q].l2.mirror_egress.is_empty() || self.staged[q].is_empty() {
                continue;
            }
            let from = &self.umems[self.ports[q].pool.index()];
            for k in 0..self.staged[q].len() {
                let d = self.staged[q][k];
                // Not sent (see `transmit`), so not mirrored.
                if d.len as usize > self.ports[q].tx_max {
                    continue;
                }
                for j in 0..self.ports[q].l2.mirror_egress.len() {
                    let m = self.ports[q].l2.mirror_egress[j].index();
                    let Some(to) = self.ports.get(m).filter(|s| s.up && m != q).map(|s| s.pool.index()) else {
                        continue;
                    };
                    match duplicate(from, &mut self.pools[to], d) {
                        Some(addr) => {
                            self.staged[m].push(d.copy_at(addr));
                            self.stats.mirror_copies.inc();
                        }
                        None => self.stats.ports[q].drop(DropReason::PoolEmpty),
                    }
                }
            }
        }
    }

    /// Drains every port's completions into its pool through that pool's `BulkReturn`, all
    /// flushed at the end.
    fn complete(&mut self) -> usize {
        let mut n = 0;
        for port in self.ports.iter_mut() {
            let g = port.pool.index();
            for queue in port.queues.iter_mut() {
                n += queue.complete(&mut self.pools[g], &mut self.bulks[g]);
            }
        }
        for (bulk, pool) in self.bulks.iter_mut().zip(&mut self.pools) {
            bulk.flush(pool);
        }
        n
    }

    /// Shuts the worker down: final completions, then every frame held by the drivers and the
    /// caches goes back to the shared pools.
    pub fn shutdown(&mut self) {
        self.complete();
        for port in self.ports.iter_mut() {
            for queue in port.queues.iter_mut() {
                queue.release_all(&mut self.pools[port.pool.index()]);
            }
        }
        for pool in &mut self.pools {
            pool.drain();
        }
    }

    /// Frames held by this worker's queues and caches right now.
    pub fn frames_held(&self) -> usize {
        self.ports.iter().map(PortSlot::frames_held).sum::<usize>()
            + self.pools.iter().map(|p| p.cached().len()).sum::<usize>()
    }
}

/// Takes the frames longer than `max` out of `staged` (a port's TX burst), each counted as
/// `EgressMtuExceeded` on the port (`st`, as a full ring counts there: the frames came in on
/// any ports) and its address put in `dropped`, for its pool.
#[cold]
#[inline(never)]
fn drop_too_long(staged: &mut Vec<Desc>, max: usize, st: &PortStats, dropped: &mut Vec<u64>) {
    staged.retain(|d| {
        let fits = d.len as usize <= max;
        if !fits {
            st.drop(DropReason::EgressMtuExceeded);
            dropped.push(d.addr);
        }
        fits
    });
}

/// A frame on its way through the L2 stage: where it is (its pool and descriptor), the VLAN
/// it is switched in, and the VID of the 802.1Q tag it arrived with (see [`L2Header::tag_raw`]).
#[derive(Clone, Copy)]
struct Frame {
    d: Desc,
    vlan: u16,
    /// [`NO_TAG`] untagged (as the batch keeps it: no conversion per frame).
    tag: u16,
    pool: PoolId,
}

/// Where the L2 lookup sends a frame.
enum Egress {
    /// Nowhere: dropped for this reason.
    Drop(DropReason),
    Port(PortId),
    Flood(FloodClass),
    /// 01:80:C2:00:00:0X: never forwarded; to the host port if there is one.
    LinkLocal,
}

/// Puts `f` in the form a port sends its VLAN in, in place: a tag popped (the addresses move
/// 4 bytes on), pushed into the frame's headroom, or a priority tag given its VLAN's id.
/// `None` when a tag must be pushed and the frame has no headroom left.
#[inline]
#[expect(clippy::cast_possible_truncation, reason = "`tag` is TAG_LEN, 4")]
fn egress_form(umem: &Umem, f: Frame, untagged: bool) -> Option<Desc> {
    let Frame { d, vlan, tag: vid, .. } = f;
    let len = d.len as usize;
    let tag = ethernet::TAG_LEN as u64;
    match (vid != NO_TAG, untagged) {
        (false, true) => Some(d),
        (true, false) => {
            if vid == 0 {
                // SAFETY: the worker holds the frame and nothing else touches it while this lives.
                let frame = unsafe { umem.bytes_mut(d.addr, len) };
                ethernet::set_vid(frame, vlan);
            }
            Some(d)
        }
        (true, true) => {
            // SAFETY: as above.
            let frame = unsafe { umem.bytes_mut(d.addr, len) };
            ethernet::pop_tag(frame).then_some(Desc { addr: d.addr + tag, len: d.len - tag as u32, ..d })
        }
        (false, false) => {
            if umem.frame_offset(d.addr) < tag {
                return None;
            }
            // SAFETY: as above; the 4 bytes before the packet are the same frame's headroom,
            // which no one else uses.
            let buf = unsafe { umem.bytes_mut(d.addr - tag, len + tag as usize) };
            ethernet::push_tag(buf, vlan).then_some(Desc { addr: d.addr - tag, len: d.len + tag as u32, ..d })
        }
    }
}

/// True when a frame whose tag is `tag` ([`NO_TAG`] untagged) leaves a port as it came: untagged
/// in and out (every port of a config without VLANs), or tagged in and out (trunk to trunk) with
/// a real VID. `untagged`: the port sends the frame's VLAN untagged.
#[inline(always)]
fn leaves_as_is(tag: u16, untagged: bool) -> bool {
    match tag {
        NO_TAG => untagged,
        vid => !untagged && vid != 0,
    }
}

/// Copies `d` (a frame of `from`) into a fresh frame from `pool`, at the same offset in its
/// frame (so it keeps the original's headroom), and gives the copy's address (its descriptor is
/// [`Desc::copy_at`] of it); `None` when the pool is empty. `pool` may be `from`'s or another UMEM group's.
///
/// The address alone, not a `Desc`: a 16-byte result goes back through the stack, and the
/// caller's wide load of it stalled on the two narrower stores (half of `copy_to`'s time in
/// perf); a `u64` comes back in a register.
#[inline]
fn duplicate(from: &Umem, pool: &mut PoolCache, d: Desc) -> Option<u64> {
    let copy = pool.alloc()?;
    let to = pool.umem();
    let off = from.frame_offset(d.addr);
    let len = d.len as usize;
    // SAFETY: `d`'s frame is held by this worker and only read while this slice lives.
    let src = unsafe { from.bytes(d.addr, len) };
    // SAFETY: `copy` was just allocated to this worker and is a different frame from `d`'s
    // (of another UMEM, or another frame of the same), so the two slices do not overlap.
    let dst = unsafe { to.bytes_mut(copy + off, len) };
    if dst.len() != src.len() {
        // Only if the UMEMs' frame sizes differ (a switch's never do): no copy rather than a panic.
        pool.put(copy);
        return None;
    }
    crate::umem::copy_packet(dst, src);
    Some(copy + off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{check_no_leak, AllocMode, SharedPool};
    use crate::umem::Umem;

    /// A queue that receives the frames in `rx` and completes every transmission at once.
    #[derive(Default)]
    struct FakeQueue {
        rx: Vec<u32>,
        sent: Vec<Desc>,
        in_flight: InFlight,
    }

    impl PortQueue for FakeQueue {
        fn rx_burst(&mut self, pool: &mut PoolCache, out: &mut [Desc]) -> usize {
            let mut n = 0;
            while n < out.len() {
                let Some(len) = self.rx.pop() else { break };
                let addr = pool.alloc().expect("test pool is large enough");
                out[n] = Desc { addr, len, options: 0 };
                n += 1;
            }
            n
        }
        fn tx_burst(&mut self, descs: &[Desc]) -> usize {
            self.sent.extend_from_slice(descs);
            self.in_flight.0.extend(descs.iter().map(|d| d.addr));
            descs.len()
        }
        fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
            let n = self.in_flight.complete(pool, bulk);
            bulk.flush(pool);
            n
        }
        fn release_all(&mut self, pool: &mut PoolCache) {
            self.in_flight.release(pool);
        }
        fn frames_held(&self) -> usize {
            self.in_flight.0.len()
        }
    }

    /// Frames a fake queue has sent that have not completed yet (each completes at the next
    /// `complete`).
    #[derive(Default)]
    struct InFlight(Vec<u64>);

    impl InFlight {
        fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
            let n = self.0.len();
            for a in self.0.drain(..) {
                bulk.push(pool, a);
            }
            n
        }
        fn release(&mut self, pool: &mut PoolCache) {
            for a in self.0.drain(..) {
                pool.put(a);
            }
        }
    }

    #[test]
    fn cross_sends_each_port_to_its_pair_and_drops_without_one() {
        let umem = Arc::new(Umem::new(1024, 2048).unwrap());
        let pool = SharedPool::new(PoolId(0), umem, 256);
        let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
        let stats = Arc::new(WorkerStats::new(0, 3, cache.stats().clone()));
        let ports = [vec![60; 100], vec![61; 7], vec![62; 5]]
            .into_iter()
            .map(|rx| PortSlot::new(vec![Box::new(FakeQueue { rx, ..Default::default() })], 1518))
            .collect();
        let opts = PipelineOptions { mode: ForwardMode::Cross, ..Default::default() };
        let mut pipe = Pipeline::new(ports, cache, Arc::new(Fdb::new(64, 300)), stats.clone(), opts);
        while pipe.poll() > 0 {}
        let tx = |p: usize| stats.ports[p].tx_packets.get();
        assert_eq!(tx(1), 100, "port 0 -> port 1");
        assert_eq!(tx(0), 7, "port 1 -> port 0");
        assert_eq!(tx(2), 0, "port 2 has no pair (port 3)");
        assert_eq!(stats.ports[2].drops[DropReason::NoEgress as usize].get(), 5);
        pipe.shutdown();
        drop(pipe);
        check_no_leak(&pool, &[]).unwrap();
    }

    /// A frame longer than its egress port's `tx_max` is not sent: counted on the egress port
    /// as `egress_mtu_exceeded` (not as sent), its frame back in the pool; the frames of the
    /// same burst around it go.
    #[test]
    fn frames_over_the_egress_ports_tx_max_are_dropped_and_counted_there() {
        let umem = Arc::new(Umem::new(1024, 2048).unwrap());
        let pool = SharedPool::new(PoolId(0), umem, 256);
        let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
        let stats = Arc::new(WorkerStats::new(0, 2, cache.stats().clone()));
        // A veth's limit for MTU 1500 (1518) on port 1; port 0 sends what it takes in (1522).
        let sizes = vec![1514, 1518, 1519, 1520, 1521, 1522, 64];
        let mut ports: Vec<PortSlot> = [sizes.clone(), sizes.clone()]
            .into_iter()
            .map(|rx| PortSlot::new(vec![Box::new(FakeQueue { rx, ..Default::default() })], 1522))
            .collect();
        ports[1].tx_max = 1518;
        let opts = PipelineOptions { mode: ForwardMode::Cross, ..Default::default() };
        let mut pipe = Pipeline::new(ports, cache, Arc::new(Fdb::new(64, 300)), stats.clone(), opts);
        while pipe.poll() > 0 {}
        let (p0, p1) = (&stats.ports[0], &stats.ports[1]);
        let too_long = |p: &PortStats| p.drops[DropReason::EgressMtuExceeded as usize].get();
        assert_eq!((p1.tx_packets.get(), p1.tx_bytes.get()), (3, 1514 + 1518 + 64), "port 0 -> port 1");
        assert_eq!(too_long(p1), 4, "1519-1522 counted on the egress port");
        assert_eq!((p0.tx_packets.get(), too_long(p0)), (7, 0), "port 1 -> port 0: all fit");
        assert_eq!(p0.drops_total(), 0, "nothing counted on the ingress port");
        pipe.shutdown();
        drop(pipe);
        check_no_leak(&pool, &[]).unwrap();
    }

    /// `batch` bounds each RX burst, at both ends of its range and clamped beyond them.
    #[test]
    fn each_burst_takes_at_most_the_configured_batch() {
        for (batch, per_poll) in [(1, 1), (7, 7), (64, 64), (256, 256), (0, 1), (1000, 256)] {
            let umem = Arc::new(Umem::new(2048, 2048).unwrap());
            let pool = SharedPool::new(PoolId(0), umem, 512);
            let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
            let stats = Arc::new(WorkerStats::new(0, 2, cache.stats().clone()));
            let ports = [vec![60; 300], Vec::new()]
                .into_iter()
                .map(|rx| PortSlot::new(vec![Box::new(FakeQueue { rx, ..Default::default() })], 1518))
                .collect();
            let opts = PipelineOptions { mode: ForwardMode::Cross, batch, ..Default::default() };
            let mut pipe = Pipeline::new(ports, cache, Arc::new(Fdb::new(64, 300)), stats.clone(), opts);
            assert_eq!(pipe.poll(), per_poll, "batch {batch}");
            while pipe.poll() > 0 {}
            assert_eq!(stats.packets.get(), 300, "batch {batch}");
            assert_eq!(stats.batches.get(), 300u64.div_ceil(per_poll as u64), "batch {batch}");
            assert_eq!(stats.ports[1].tx_packets.get(), 300, "batch {batch}");
            pipe.shutdown();
            drop(pipe);
            check_no_leak(&pool, &[]).unwrap();
        }
    }

    /// `set_batch` (a reload of `switch.batch`) bounds the next bursts, clamped like the option.
    #[test]
    fn the_batch_changes_between_rounds() {
        let umem = Arc::new(Umem::new(2048, 2048).unwrap());
        let pool = SharedPool::new(PoolId(0), umem, 512);
        let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
        let stats = Arc::new(WorkerStats::new(0, 2, cache.stats().clone()));
        let ports = [vec![60; 400], Vec::new()]
            .into_iter()
            .map(|rx| PortSlot::new(vec![Box::new(FakeQueue { rx, ..Default::default() })], 1518))
            .collect();
        let opts = PipelineOptions { mode: ForwardMode::Cross, ..Default::default() };
        let mut pipe = Pipeline::new(ports, cache, Arc::new(Fdb::new(64, 300)), stats.clone(), opts);
        assert_eq!(pipe.poll(), DEFAULT_BATCH);
        for (batch, per_poll) in [(3, 3), (0, 1), (1000, 256), (1, 1)] {
            pipe.set_batch(batch);
            assert_eq!(pipe.poll(), per_poll, "set_batch({batch})");
        }
        while pipe.poll() > 0 {}
        assert_eq!(stats.ports[1].tx_packets.get(), 400, "every frame forwarded");
        pipe.shutdown();
        drop(pipe);
        check_no_leak(&pool, &[]).unwrap();
    }

    /// A queue whose transmissions never complete (the kernel still holds them).
    fn stuck() -> Box<dyn PortQueue> {
        Box::new(FakeQueue { rx: vec![60; 40], ..Default::default() })
    }

    #[test]
    fn ports_attached_and_detached_between_rounds_return_every_frame() {
        let umem = Arc::new(Umem::new(1024, 2048).unwrap());
        let pool = SharedPool::new(PoolId(0), umem, 256);
        let cache = PoolCache::new(pool.clone(), 128, AllocMode::Recycling);
        let stats = Arc::new(WorkerStats::new(0, 4, cache.stats().clone()));
        let ports = vec![PortSlot::new(vec![stuck()], 1518), PortSlot::new(Vec::new(), 1518)];
        let opts = PipelineOptions { mode: ForwardMode::Cross, ..Default::default() };
        let mut pipe = Pipeline::new(ports, cache, Arc::new(Fdb::new(64, 300)), stats.clone(), opts);
        // Port 1 has no queue yet, so it is down: port 0's frames have no egress.
        assert!(!pipe.ports()[1].up);
        while pipe.poll() > 0 {}
        assert_eq!(stats.ports[0].drops[DropReason::NoEgress as usize].get(), 40);
        pipe.detach_port(PortId(1));
        pipe.attach_port(PortId(1), PortSlot::new(vec![stuck()], 1518), true);
        pipe.attach_port(PortId(3), PortSlot::new(vec![stuck()], 1518), true);
        assert_eq!(pipe.ports().len(), 4, "id 2 stays empty and down");
        assert!(!pipe.ports()[2].up);
        while pipe.poll() > 0 {}
        assert_eq!(stats.ports[0].tx_packets.get(), 40, "port 1's frames crossed to port 0");
        // Port 0 is detached with frames in flight: they come back to the pool.
        pipe.detach_port(PortId(0));
        assert_eq!(pipe.ports()[0].queues.len(), 0);
        // A fresh port on a used id counts from zero; a replaced one carries on.
        pipe.attach_port(PortId(0), PortSlot::new(Vec::new(), 1518), true);
        assert_eq!(stats.ports[0].tx_packets.get(), 0);
        let before = stats.ports[1].rx_packets.get();
        pipe.attach_port(PortId(1), PortSlot::new(Vec::new(), 1518), false);
        assert_eq!(stats.ports[1].rx_packets.get(), before);
        pipe.set_max_frame(PortId(3), 100, 96);
        assert_eq!((pipe.ports()[3].max_frame, pipe.ports()[3].tx_max), (100, 96));
        pipe.shutdown();
        drop(pipe);
        check_no_leak(&pool, &[]).unwrap();
    }

    /// A queue of one UMEM group that receives whole frames and records the bytes it is asked
    /// to send, read from its own UMEM: a frame of another group's pool staged on it would read
    /// as whatever its own UMEM holds at that address.
    struct WireQueue {
        umem: Arc<Umem>,
        rx: Vec<Vec<u8>>,
        sent: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
        in_flight: InFlight,
    }

    impl PortQueue for WireQueue {
        fn rx_burst(&mut self, pool: &mut PoolCache, out: &mut [Desc]) -> usize {
            assert!(Arc::ptr_eq(pool.umem(), &self.umem), "RX refilled from another group's pool");
            let mut n = 0;
            while n < out.len() {
                let Some(f) = self.rx.pop() else { break };
                let addr = pool.alloc().expect("test pool is large enough") + 256;
                // SAFETY: the frame was just allocated to this test.
                unsafe { self.umem.bytes_mut(addr, f.len()) }.copy_from_slice(&f);
                out[n] = Desc { addr, len: u32::try_from(f.len()).unwrap(), options: 0 };
                n += 1;
            }
            n
        }
        fn tx_burst(&mut self, descs: &[Desc]) -> usize {
            let mut sent = self.sent.lock().unwrap();
            for d in descs {
                // SAFETY: the pipeline handed the frame over for transmission.
                sent.push(unsafe { self.umem.bytes(d.addr, d.len as usize) }.to_vec());
                self.in_flight.0.push(d.addr);
            }
            descs.len()
        }
        fn complete(&mut self, pool: &mut PoolCache, bulk: &mut BulkReturn) -> usize {
            assert!(Arc::ptr_eq(pool.umem(), &self.umem), "completions returned to another group's pool");
            self.in_flight.complete(pool, bulk)
        }
        fn release_all(&mut self, pool: &mut PoolCache) {
            self.in_flight.release(pool);
        }
        fn frames_held(&self) -> usize {
            self.in_flight.0.len()
        }
    }

    #[test]
    fn frames_cross_umem_groups_by_copy_and_each_goes_back_to_its_own_pool() {
        use crate::wire::build::ethernet_frame;
        let a = MacAddr([2, 0, 0, 0, 0, 0xa]);
        let b = MacAddr([2, 0, 0, 0, 0, 0xb]);
        let frame = |dst, src, seq: u16| ethernet_frame(dst, src, 0x88b5, &[&seq.to_be_bytes()[..], &[7; 58]].concat());
        let umems = [Arc::new(Umem::new(256, 2048).unwrap()), Arc::new(Umem::new(256, 2048).unwrap())];
        let pools: Vec<_> = umems
            .iter()
            .enumerate()
            .map(|(i, u)| SharedPool::new(PoolId(u16::try_from(i).unwrap()), u.clone(), 64))
            .collect();
        let pool_stats = Arc::new(crate::pool::PoolStats::default());
        let caches = pools
            .iter()
            .map(|p| PoolCache::with_stats(p.clone(), 32, AllocMode::Recycling, pool_stats.clone()))
            .collect();
        let stats = Arc::new(WorkerStats::new(0, 3, pool_stats));
        // Port 0 (group 0) floods 300 frames from `a`; port 1 (group 1) answers `a` 300 times by
        // unicast; port 2 is in group 0 with port 0. More frames than either pool has: frames
        // must go back to their own pool for the run to finish without `PoolEmpty`.
        let rx: [Vec<Vec<u8>>; 3] = [
            (0..300).rev().map(|i| frame(MacAddr::BROADCAST, a, i)).collect(),
            (0..300).rev().map(|i| frame(a, b, 1000 + i)).collect(),
            Vec::new(),
        ];
        let logs: Vec<Arc<std::sync::Mutex<Vec<Vec<u8>>>>> = (0..3).map(|_| Arc::default()).collect();
        let ports = rx
            .into_iter()
            .zip([PoolId(0), PoolId(1), PoolId(0)])
            .zip(&logs)
            .map(|((rx, g), sent): ((Vec<Vec<u8>>, PoolId), _)| {
                let q = WireQueue {
                    umem: umems[g.index()].clone(),
                    rx,
                    sent: sent.clone(),
                    in_flight: InFlight::default(),
                };
                PortSlot::new(vec![Box::new(q)], 1518).with_pool(g)
            })
            .collect();
        let mut pipe =
            Pipeline::with_pools(ports, caches, Arc::new(Fdb::new(64, 300)), stats.clone(), Default::default());
        // Round one polls port 0 first, so `a` is learned before port 1's frames look it up.
        while pipe.poll() > 0 {}
        let seqs = |p: usize| -> Vec<u16> {
            logs[p].lock().unwrap().iter().map(|f| u16::from_be_bytes([f[14], f[15]])).collect()
        };
        let flooded: Vec<u16> = (0..300).collect();
        let answered: Vec<u16> = (1000..1300).collect();
        assert_eq!(seqs(1), flooded, "port 1 (group 1) got every flooded frame intact");
        assert_eq!(seqs(2), flooded, "port 2 (group 0) got every flooded frame intact");
        assert_eq!(seqs(0), answered, "port 0 (group 0) got every answer intact");
        assert!(logs.iter().all(|l| l.lock().unwrap().iter().all(|f| f.len() == 74 && f[16..] == [7; 58])));
        assert_eq!(stats.umem_copies.get(), 300, "the answers crossed by copy");
        assert_eq!(stats.flood_copies.get(), 300, "the flood's copy for port 1 went straight to its group");
        let dropped: u64 = stats.ports.iter().flat_map(|p| p.drops.iter()).map(|c| c.get()).sum();
        assert_eq!(dropped, 0);
        pipe.shutdown();
        drop(pipe);
        for p in &pools {
            check_no_leak(p, &[]).unwrap();
        }
    }
}
