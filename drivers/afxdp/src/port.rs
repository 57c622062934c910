//! [`AfXdpPort`]: every AF_XDP socket of one interface, its XSKMAP, program and link.

use std::io;
use std::sync::{Arc, Mutex, Weak};

use wasmswitch_core::Umem;

use crate::bpf::{XdpLink, XdpProgram, XskMap};
use crate::error::AfXdpError;
use crate::profile::{self, BindMode, Decision, Overrides, RingSizes};
use crate::queue::{AfXdpQueue, QueueStats};
use crate::sys;
use crate::xsk::{self, SetupError, SockHandle, UmemBinding, XdpStatistics};

/// One port of the config: the interface name and the operator's overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSpec {
    /// The interface's name.
    pub iface: String,
    /// What the operator set over the driver's profile.
    pub overrides: Overrides,
}

impl PortSpec {
    /// `iface` with no overrides.
    pub fn new(iface: impl Into<String>) -> Self {
        Self { iface: iface.into(), overrides: Overrides::default() }
    }
}

/// The kernel registration of one [`Umem`], shared by every socket of every port opened with it.
///
/// The first socket opened registers the UMEM (`XDP_UMEM_REG`) and fixes its bind mode (copy or
/// zero-copy, the kernel applies it to all sharers); every later socket binds with
/// `XDP_SHARED_UMEM` to any still-open socket of the UMEM. The registration holds sockets only
/// weakly: closing a port's queues closes its sockets; once none is left, the next open
/// registers the UMEM again.
pub struct UmemRegistration {
    umem: Arc<Umem>,
    state: Mutex<RegState>,
}

#[derive(Default)]
struct RegState {
    sockets: Vec<Weak<SockHandle>>,
    mode: Option<(BindMode, String)>,
}

impl std::fmt::Debug for UmemRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmemRegistration").field("frames", &self.umem.frames()).finish()
    }
}

impl UmemRegistration {
    /// `umem`, not yet registered with the kernel (the first socket opened does that).
    pub fn new(umem: Arc<Umem>) -> Self {
        Self { umem, state: Mutex::default() }
    }

    /// The UMEM.
    pub fn umem(&self) -> &Arc<Umem> {
        &self.umem
    }

    fn check_mode(&self, iface: &str, wanted: BindMode) -> Result<(), AfXdpError> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).check_mode(iface, wanted)
    }

    /// The bind mode every socket of this UMEM uses, once the first one is open.
    pub fn bind_mode(&self) -> Option<BindMode> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.prune();
        st.mode.as_ref().map(|m| m.0)
    }
}

impl RegState {
    /// All sockets of a UMEM share the first one's bind mode (the kernel's rule).
    fn check_mode(&mut self, iface: &str, wanted: BindMode) -> Result<(), AfXdpError> {
        self.prune();
        match &self.mode {
            Some((have, first)) if *have != wanted => {
                Err(AfXdpError::UmemModeMismatch { iface: iface.into(), wanted, have: *have, first: first.clone() })
            }
            _ => Ok(()),
        }
    }

    fn prune(&mut self) {
        self.sockets.retain(|w| w.strong_count() > 0);
        if self.sockets.is_empty() {
            self.mode = None;
        }
    }
}

/// One queue's counters, readable from any thread: the driver's own ([`QueueStats`]) and the
/// kernel's `XDP_STATISTICS` (read with one `getsockopt` per scrape, never on the datapath).
#[derive(Clone, Debug)]
pub struct QueueMonitor {
    /// The queue id.
    pub queue: u32,
    /// The driver's counters of the queue.
    pub stats: Arc<QueueStats>,
    sock: Weak<SockHandle>,
    /// What the sockets this queue had before its current one counted (see `carry_over`).
    kernel_before: XdpStatistics,
}

impl QueueMonitor {
    /// The kernel's counters, `None` once the socket is closed.
    pub fn xdp_stats(&self) -> Option<XdpStatistics> {
        self.sock.upgrade().and_then(|s| s.statistics().ok()).map(|s| s + self.kernel_before)
    }

    /// True when this queue's socket is open and the kernel has unbound it from its device
    /// ([`SockHandle::unbound`]).
    pub fn unbound(&self) -> bool {
        self.sock.upgrade().is_some_and(|s| s.unbound())
    }

    /// Everything this queue has counted so far, held after its socket closes: what a
    /// re-attached port's queue carries over (`carry_over`). Read it while the socket is open.
    pub fn frozen(&self) -> QueueMonitor {
        let kernel_before = self.xdp_stats().unwrap_or(self.kernel_before);
        QueueMonitor { queue: self.queue, stats: self.stats.clone(), sock: Weak::new(), kernel_before }
    }

    /// Makes this queue's counters continue `old`'s (a [`QueueMonitor::frozen`] of the queue it
    /// replaces), so that no `_total` series goes backwards. Before this queue runs.
    pub fn carry_over(&mut self, old: &QueueMonitor) {
        self.stats.carry(&old.stats);
        self.kernel_before = self.kernel_before + old.kernel_before;
    }
}

/// Generic (SKB-mode) XDP runs after GRO, and LRO aggregates in the NIC: either hands the
/// program one linearized frame of up to 64 KiB for a whole TCP burst, which no UMEM frame can
/// hold, so the kernel drops it and TCP through the port crawls. Native XDP drivers turn LRO
/// off themselves and run before GRO. So a generic-mode port turns both off while it is
/// attached and puts back what it found when it closes. What it found is also noted in a file
/// ([`note_path`]) until then: a SIGKILLed daemon cannot restore it, but the next one to attach
/// to that interface finds the note and restores the state the first one found.
#[derive(Debug)]
struct AggregationGuard {
    iface: String,
    /// The device's index when it was turned off: a device re-created under the name is another
    /// one, with its own (fresh) state, that the restore must not touch.
    ifindex: u32,
    was: sys::Aggregation,
    note: Option<std::path::PathBuf>,
}

/// Where the GRO/LRO state an attach found on `iface` is noted: `WASMSWITCH_STATE_DIR`, else
/// systemd's `RUNTIME_DIRECTORY`, else `/run/wasmswitch`; the network namespace is in the
/// name, as two namespaces may each have an `eth0`.
fn note_path(iface: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("WASMSWITCH_STATE_DIR")
        .or_else(|| std::env::var_os("RUNTIME_DIRECTORY"))
        .map_or_else(|| std::path::PathBuf::from("/run/wasmswitch"), std::path::PathBuf::from);
    let netns =
        std::fs::read_link("/proc/thread-self/ns/net").map(|l| l.to_string_lossy().into_owned()).unwrap_or_default();
    let netns: String = netns.chars().filter(char::is_ascii_digit).collect();
    dir.join(format!("aggregation-{netns}-{iface}"))
}

impl AggregationGuard {
    fn disable(iface: &str, ifindex: u32) -> Option<Self> {
        let now = match sys::aggregation(iface) {
            Ok(a) => a,
            Err(e) => {
                log::warn!("{iface}: cannot read GRO/LRO ({e}); aggregated frames will be dropped in generic mode");
                return None;
            }
        };
        let path = note_path(iface);
        // A note left by a daemon that was killed while attached: what it found is the state
        // to restore, not the "off" it left.
        let noted = std::fs::read_to_string(&path).ok().and_then(|t| {
            let flag = |k: &str| t.split_whitespace().find_map(|w| w.strip_prefix(k)).map(|v| v == "1");
            Some(sys::Aggregation { gro: flag("gro=")?, lro: flag("lro=")? })
        });
        if let Some(n) = noted {
            log::info!(
                "{iface}: a daemon killed while attached left GRO/LRO off; they go back to gro {}, lro {} at exit",
                n.gro,
                n.lro
            );
        }
        let was = noted.unwrap_or(now);
        if !was.gro && !was.lro {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        let note = path.parent().and_then(|d| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d).ok()?;
            std::fs::write(&path, format!("gro={} lro={}\n", was.gro as u8, was.lro as u8)).ok()?;
            Some(path.clone())
        });
        if note.is_none() {
            log::info!("{iface}: cannot note GRO/LRO in {} (a daemon killed now leaves them off)", path.display());
        }
        match sys::set_aggregation(iface, sys::Aggregation { gro: false, lro: false }) {
            Ok(()) => {
                log::info!(
                    "{iface}: GRO/LRO off while attached in generic mode (was gro {}, lro {})",
                    was.gro,
                    was.lro
                );
                Some(Self { iface: iface.into(), ifindex, was, note })
            }
            Err(e) => {
                log::warn!("{iface}: cannot turn GRO/LRO off ({e}); aggregated frames will be dropped in generic mode");
                None
            }
        }
    }
}

impl Drop for AggregationGuard {
    fn drop(&mut self) {
        match sys::ifindex(&self.iface) {
            Some(i) if i == self.ifindex => {}
            // Another device under the name: what was found belonged to the old one.
            Some(_) => {
                if let Some(n) = &self.note {
                    let _ = std::fs::remove_file(n);
                }
                return;
            }
            // None here now (renamed, in another namespace): the note stays, for an attach
            // to the device when it is back under the name.
            None => return,
        }
        match sys::set_aggregation(&self.iface, self.was) {
            Ok(()) => {
                if let Some(n) = &self.note {
                    let _ = std::fs::remove_file(n);
                }
            }
            // The note stays: the next attach may restore it.
            Err(e) => log::warn!("{}: cannot restore GRO/LRO ({e})", self.iface),
        }
    }
}

/// An interface opened for AF_XDP: one socket per selected queue, all on the shared UMEM, and
/// the redirect program attached through a bpf_link.
///
/// Dropping the port detaches the program (closes the link) and closes the sockets of queues
/// not taken; taken queues close their socket when released or dropped.
pub struct AfXdpPort {
    // Field order is drop order: the link goes first, so traffic stops being redirected before
    // anything else is torn down.
    _link: XdpLink,
    /// Restores GRO/LRO after the program is gone (generic mode turned them off).
    _aggregation: Option<AggregationGuard>,
    map: XskMap,
    _prog: XdpProgram,
    iface: String,
    ifindex: u32,
    decision: Decision,
    queues: Vec<(u32, AfXdpQueue)>,
    handles: Vec<(u32, Weak<SockHandle>, Arc<QueueStats>)>,
}

impl std::fmt::Debug for AfXdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfXdpPort").field("iface", &self.iface).field("decision", &self.decision).finish()
    }
}

/// What ethtool says about an interface: driver name and queue count.
pub fn probe(iface: &str) -> (String, u32) {
    let driver = sys::driver_name(iface).unwrap_or_else(|e| {
        log::warn!("{iface}: ETHTOOL_GDRVINFO failed ({e}); using the generic profile");
        String::new()
    });
    let channels = match sys::channels(iface) {
        Ok(ch) => profile::queue_count(ch.combined_count, ch.rx_count),
        Err(e) => {
            log::info!("{iface}: ETHTOOL_GCHANNELS failed ({e}); assuming one queue");
            1
        }
    };
    (driver, channels)
}

/// What [`AfXdpPort::open`] would choose for `spec` (profile from the driver, then the
/// overrides), without opening anything: e.g. to pick the UMEM a port's bind mode needs.
pub fn decide(spec: &PortSpec) -> Decision {
    let (driver, channels) = probe(&spec.iface);
    profile::decide(&driver, channels, &spec.overrides)
}

/// What [`AfXdpPort::open`] would choose for `spec`, or what it would refuse, found without
/// creating anything: the interface, its queues, the ring sizes, and zero-copy where the
/// driver declares its XDP features without it. `wasmswitch check` runs this too, so that
/// what it accepts, `run` starts.
pub fn preflight(spec: &PortSpec) -> Result<Decision, AfXdpError> {
    let iface = spec.iface.as_str();
    let ifindex = sys::ifindex(iface).ok_or_else(|| AfXdpError::InterfaceMissing { iface: iface.into() })?;
    let decision = decide(spec);
    refusal(iface, ifindex, &decision)?;
    Ok(decision)
}

/// What [`preflight`] checks of a decision for `iface`.
fn refusal(iface: &str, ifindex: u32, decision: &Decision) -> Result<(), AfXdpError> {
    if let Some(&q) = decision.queues.iter().find(|&&q| q >= decision.channels) {
        return Err(AfXdpError::QueueOutOfRange { iface: iface.into(), queue: q, channels: decision.channels });
    }
    if decision.queues.is_empty() {
        return Err(AfXdpError::QueueOutOfRange { iface: iface.into(), queue: 0, channels: 0 });
    }
    check_rings(iface, &decision.rings)?;
    if decision.bind == BindMode::ZeroCopy {
        // A driver that declares no XDP features at all (one out of tree, say) may still bind
        // zero-copy: only the bind itself can tell, so only a declared set without it refuses.
        match sys::xdp_features(ifindex) {
            Ok(Some(f)) if f.0 != 0 && !f.zero_copy() => {
                return Err(AfXdpError::NoZeroCopy {
                    iface: iface.into(),
                    driver: decision.driver.clone(),
                    features: f.names(),
                });
            }
            Ok(_) => {}
            Err(e) => log::debug!("{iface}: the netdev family's dev-get failed ({e}); the bind will tell"),
        }
    }
    Ok(())
}

fn check_ring(iface: &str, ring: &'static str, size: u32) -> Result<(), AfXdpError> {
    if size.is_power_of_two() && (64..=65536).contains(&size) {
        Ok(())
    } else {
        Err(AfXdpError::BadRingSize { iface: iface.into(), ring, size })
    }
}

fn check_rings(iface: &str, r: &RingSizes) -> Result<(), AfXdpError> {
    check_ring(iface, "rx", r.rx)?;
    check_ring(iface, "tx", r.tx)?;
    check_ring(iface, "fill", r.fill)?;
    check_ring(iface, "completion", r.completion)
}

fn attached_mode(mode: u8) -> &'static str {
    match mode {
        1 => "native",
        2 => "generic",
        3 => "offloaded",
        4 => "several modes",
        _ => "unknown mode",
    }
}

impl AfXdpPort {
    /// Opens `spec.iface` in the caller's network namespace: probes the driver, decides the
    /// modes, checks everything that can be checked, creates and binds one socket per queue on
    /// the shared UMEM, loads the redirect program and attaches it.
    ///
    /// Until the queues' first `rx_burst` posts frames to their fill rings, packets arriving on
    /// the interface are dropped by the kernel (counted in `xdp_stats().rx_dropped`).
    pub fn open(spec: &PortSpec, reg: &UmemRegistration) -> Result<Self, AfXdpError> {
        let iface = spec.iface.as_str();
        let ifindex = sys::ifindex(iface).ok_or_else(|| AfXdpError::InterfaceMissing { iface: iface.into() })?;
        let umem = &reg.umem;
        let fs = umem.frame_size();
        if !(2048..=4096).contains(&fs) {
            return Err(AfXdpError::BadFrameSize(fs));
        }
        let decision = decide(spec);
        // The UMEM's own rule first: it holds whatever the interface offers.
        reg.check_mode(iface, decision.bind)?;
        refusal(iface, ifindex, &decision)?;

        // Someone else's program on the hook: say so before creating anything.
        let att = sys::xdp_attached(ifindex)
            .map_err(|e| AfXdpError::sys(iface, "querying the interface's XDP state (RTM_GETLINK)", e))?;
        if att.mode != 0 {
            return Err(AfXdpError::AlreadyAttached {
                iface: iface.into(),
                prog_id: att.prog_id,
                mode: attached_mode(att.mode),
            });
        }

        let max_q = *decision.queues.last().expect("checked non-empty");
        let map = XskMap::new(max_q + 1)
            .map_err(|e| AfXdpError::sys(iface, "creating the XSKMAP (bpf BPF_MAP_CREATE)", e))?;
        // Native mode: the program that puts back VLAN tags the kernel holds outside the frame,
        // where the kernel has the kfunc; generic XDP cannot call it (see the README).
        let vlan_restoring = match decision.attach {
            profile::AttachMode::Native => match XdpProgram::load_vlan_restoring(&map, ifindex) {
                Some(Ok(p)) => Some(p),
                Some(Err((e, log))) => {
                    log::warn!(
                        "{iface}: the XDP program that restores offloaded VLAN tags did not load ({e}); \
                         tags a sender offloads are not seen: {}",
                        // The verifier's reason is its last line before the statistics.
                        log.lines().rev().find(|l| !l.starts_with("processed ") && !l.trim().is_empty()).unwrap_or("")
                    );
                    None
                }
                None => None,
            },
            profile::AttachMode::Generic => None,
        };
        let restores_vlan_tags = vlan_restoring.is_some();
        let prog = match vlan_restoring {
            Some(p) => p,
            None => XdpProgram::load(&map).map_err(|(e, log)| match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) if log.is_empty() => {
                    AfXdpError::sys(iface, "loading the XDP program (BPF_PROG_LOAD)", e)
                }
                _ => AfXdpError::ProgLoad { iface: iface.into(), source: e, log },
            })?,
        };

        let mut queues = Vec::with_capacity(decision.queues.len());
        let mut handles = Vec::with_capacity(decision.queues.len());
        {
            let mut st = reg.state.lock().unwrap_or_else(|e| e.into_inner());
            st.check_mode(iface, decision.bind)?;
            for &q in &decision.queues {
                let s = loop {
                    let anchor = st.sockets.iter().find_map(Weak::upgrade);
                    let binding = match &anchor {
                        Some(a) => UmemBinding::Share(a.raw()),
                        None => UmemBinding::Register(decision.bind),
                    };
                    match xsk::open_socket(umem, iface, ifindex, q, decision.rings, binding) {
                        // The anchor's interface went away and the kernel unbound its socket
                        // (it stays open until its port lets go): share another, or register
                        // the UMEM anew when none is left.
                        Err(SetupError::Bind(e)) if anchor.is_some() && e.raw_os_error() == Some(libc::EBADF) => {
                            let dead = anchor.map(|a| a.raw());
                            st.sockets.retain(|w| w.upgrade().is_some_and(|a| Some(a.raw()) != dead));
                        }
                        other => break other,
                    }
                };
                let s = s.map_err(|e| match e {
                    SetupError::Socket(e) => AfXdpError::sys(iface, "socket(AF_XDP)", e),
                    SetupError::UmemReg(e) => AfXdpError::sys(iface, "registering the UMEM (XDP_UMEM_REG)", e),
                    SetupError::Rings(e) => AfXdpError::sys(iface, "setting up the AF_XDP rings", e),
                    SetupError::Mmap(e) => AfXdpError::sys(iface, "mapping the AF_XDP rings", e),
                    SetupError::Bind(e) => match e.raw_os_error() {
                        Some(libc::EOPNOTSUPP) if decision.bind == BindMode::ZeroCopy => {
                            AfXdpError::ZeroCopyUnsupported {
                                iface: iface.into(),
                                driver: decision.driver.clone(),
                                queue: q,
                                source: e,
                            }
                        }
                        Some(libc::EBUSY) => AfXdpError::QueueBusy { iface: iface.into(), queue: q },
                        _ => AfXdpError::sys(iface, "binding the AF_XDP socket", e),
                    },
                })?;
                if st.mode.is_none() {
                    st.mode = Some((decision.bind, format!("{iface} queue {q}")));
                }
                st.sockets.push(Arc::downgrade(&s.handle));
                map.insert(q, s.handle.raw())
                    .map_err(|e| AfXdpError::sys(iface, "inserting the socket into the XSKMAP", e))?;
                let queue = AfXdpQueue::new(s.handle.clone(), s.rx, s.tx, umem);
                handles.push((q, Arc::downgrade(&s.handle), queue.stats().clone()));
                queues.push((q, queue));
            }
        }

        let link =
            XdpLink::attach(&prog, ifindex, decision.attach.xdp_flags()).map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) | Some(libc::EEXIST) => {
                    let att = sys::xdp_attached(ifindex).unwrap_or_default();
                    AfXdpError::AlreadyAttached {
                        iface: iface.into(),
                        prog_id: att.prog_id,
                        mode: attached_mode(att.mode),
                    }
                }
                // The kernel also answers EINVAL for an index no device has: one that vanished
                // in between is not a driver without native XDP.
                Some(libc::EINVAL) if sys::ifindex(iface) != Some(ifindex) => {
                    AfXdpError::sys(iface, "attaching the XDP program (the interface vanished meanwhile)", e)
                }
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) if decision.attach == profile::AttachMode::Native => {
                    AfXdpError::NativeUnsupported { iface: iface.into(), driver: decision.driver.clone(), source: e }
                }
                _ => AfXdpError::sys(iface, "attaching the XDP program (BPF_LINK_CREATE)", e),
            })?;
        let aggregation = if decision.attach == profile::AttachMode::Generic {
            AggregationGuard::disable(iface, ifindex)
        } else {
            None
        };
        log::info!(
            "{iface}: AF_XDP {decision}{}",
            if restores_vlan_tags { "; offloaded VLAN tags restored" } else { "; offloaded VLAN tags not seen" }
        );
        Ok(Self {
            _link: link,
            _aggregation: aggregation,
            map,
            _prog: prog,
            iface: iface.into(),
            ifindex,
            decision,
            queues,
            handles,
        })
    }

    /// The queues, each with its queue id, for the workers. Each is an exclusive
    /// `PortQueue`; use [`AfXdpQueue::share_tx`] to give TX-only handles to more workers.
    pub fn take_queues(&mut self) -> Vec<(u32, AfXdpQueue)> {
        std::mem::take(&mut self.queues)
    }

    /// [`take_queues`](Self::take_queues), boxed for a `PortSlot`.
    pub fn take_boxed_queues(&mut self) -> Vec<(u32, Box<dyn wasmswitch_core::PortQueue>)> {
        self.take_queues().into_iter().map(|(q, x)| (q, Box::new(x) as Box<dyn wasmswitch_core::PortQueue>)).collect()
    }

    /// What the profile and overrides chose (log it; `decision.profile`, `attach` and `bind`
    /// make good metric labels).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The interface's name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The kernel's `XDP_STATISTICS` per queue (`None` for a queue whose socket is closed).
    pub fn xdp_stats(&self) -> Vec<(u32, Option<XdpStatistics>)> {
        self.handles.iter().map(|(q, w, _)| (*q, w.upgrade().and_then(|s| s.statistics().ok()))).collect()
    }

    /// Per queue, a handle for the metrics thread: the driver's counters and the kernel's.
    pub fn queue_stats(&self) -> Vec<QueueMonitor> {
        self.handles
            .iter()
            .map(|(q, w, s)| QueueMonitor {
                queue: *q,
                stats: s.clone(),
                sock: w.clone(),
                kernel_before: Default::default(),
            })
            .collect()
    }

    /// Stops redirecting `queue` to its socket (its traffic goes to the kernel stack).
    pub fn unmap_queue(&self, queue: u32) -> io::Result<()> {
        self.map.remove(queue)
    }

    /// UMEM frames this port can hold at once: each queue's fill ring plus its TX ring.
    /// Size the UMEM as the sum over ports plus each worker's pool cache and some slack.
    pub fn frames_wanted(&self) -> usize {
        let r = self.decision.rings;
        self.decision.queues.len() * (r.fill + r.tx) as usize
    }
}
