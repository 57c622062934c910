//! `wasmswitch run`: the daemon's lifecycle (start, serve, reload, drain, exit).
//!
//! Three kinds of threads: the datapath workers, the HTTP/signal thread (a current-thread tokio
//! runtime on the main thread) and one control thread that runs reloads. A reload compiles
//! plugins for as long as it takes without holding anything the HTTP handlers or the shutdown
//! path need, so `/healthz` and `/metrics` answer and SIGTERM ends the daemon while it runs.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{oneshot, watch};
use wasmswitch_core::fdb::{Flush, Select};
use wasmswitch_core::vlan::Vid;

use crate::api::{
    self, router, ApiState, ChangeError, Control, ControlStats, FdbChange, FdbCursor, FdbEntry, FdbPage, FdbPageError,
    FdbQuery, Limits, RefusalLog, ReloadBusy, ReloadOutcome, ReloadResult, ShadowResult,
};
use crate::config::Config;
use crate::dataplane::{Command, Dataplane, ShadowOp};
use crate::metrics::{Metrics, SwitchCollector};
use crate::plugins::{Role, Running};

/// The running switch: its config and datapath.
pub struct Switch {
    /// The config file, which a reload reads again.
    pub path: PathBuf,
    /// The running datapath: workers, ports, FDB.
    pub dataplane: Dataplane,
    /// The plugins' counters and states, for `/metrics` and the API.
    pub plugin_metrics: Arc<crate::plugins::PluginMetrics>,
    /// Rate limit of the lines of changes and refused changes (FDB edits, reloads, shadow
    /// changes): one per kind every [`crate::api::REFUSAL_LOG_EVERY`], then a count.
    pub log_limit: RefusalLog,
}

impl Switch {
    /// Loads the config at `path` and starts the switch on it.
    pub fn start(path: &Path) -> Result<Switch> {
        Self::start_with(path, Config::load(path)?)
    }

    /// Starts the switch on `config`, loaded from `path`.
    pub fn start_with(path: &Path, config: Config) -> Result<Switch> {
        let plugin_metrics = Arc::new(crate::plugins::PluginMetrics::default());
        let dataplane = Dataplane::start_with_plugins(&config, Some(&plugin_metrics))?;
        Ok(Switch { path: path.to_owned(), dataplane, plugin_metrics, log_limit: RefusalLog::default() })
    }

    /// The running config (kept by the datapath, whose re-attaches check against it); replaced
    /// only by a reload or shadow change that applied all of its changes.
    pub fn config(&self) -> Arc<Config> {
        self.dataplane.config()
    }

    /// A metrics collector over this switch's ports, workers, pools, FDB and plugins.
    pub fn collector(&self) -> SwitchCollector {
        let dp = &self.dataplane;
        SwitchCollector {
            ports: dp.ports.clone(),
            workers: dp.workers.iter().map(|w| w.stats.clone()).collect(),
            groups: dp.groups.clone(),
            fdb: dp.fdb.clone(),
            start: dp.start,
            extra: vec![self.plugin_metrics.clone() as Arc<dyn crate::metrics::MetricsSource>],
        }
    }

    /// The answer of `GET /api/v1/ports`: each running port's id, name, driver, mode, UMEM
    /// group, queues, link state and packet totals.
    pub fn ports_json(&self) -> serde_json::Value {
        let dp = &self.dataplane;
        let ports: Vec<_> = dp
            .ports
            .snapshot()
            .into_iter()
            .map(|(p, info)| {
                let sum = |f: &dyn Fn(&wasmswitch_core::stats::PortStats) -> u64| -> u64 {
                    dp.workers.iter().map(|w| f(&w.stats.ports[p.index()])).sum()
                };
                json!({
                    "id": p.0,
                    "name": info.name,
                    "driver": info.driver.kind(),
                    "mode": info.mode,
                    "umem": info.umem,
                    "queues": info.queues,
                    "up": !info.gone.load(Ordering::Relaxed) && !info.link_down.load(Ordering::Relaxed),
                    "link": if info.gone.load(Ordering::Relaxed) {
                        "gone"
                    } else if info.link_down.load(Ordering::Relaxed) {
                        "down"
                    } else {
                        "up"
                    },
                    "rx_packets": sum(&|s| s.rx_packets.get()),
                    "tx_packets": sum(&|s| s.tx_packets.get()),
                    "drops": sum(&|s| s.drops_total()),
                })
            })
            .collect();
        json!({ "ports": ports })
    }

    /// A page of the FDB listing: at most `query.limit` entries, after looking at
    /// [`api::FDB_PAGE_SCAN`] slots at most, from the cursor's slot of the table it names.
    /// Reads the lock-free table without its edits lock (nothing waits for a page).
    pub fn fdb_page(&self, query: &FdbQuery) -> Result<FdbPage, FdbPageError> {
        let dp = &self.dataplane;
        let now = dp.start.elapsed().as_secs() as u32;
        let fdb = dp.fdb.get();
        let from = match query.cursor {
            None => 0,
            Some(c) if c.table != fdb.id() => {
                return Err(FdbPageError::Stale(format!(
                    "cursor {c} is of a table that is gone (a reload changed fdb.capacity, or the daemon restarted): start the listing again without a cursor"
                )))
            }
            Some(c) if c.slot >= fdb.capacity() => {
                return Err(FdbPageError::Bad(format!(
                    "cursor {c} is past the table's end ({} slots): pass back the `next` of the last page as it came",
                    fdb.capacity()
                )))
            }
            Some(c) => c.slot,
        };
        let port = match &query.port {
            None => None,
            Some(name) => Some(
                dp.ports
                    .id_of(name)
                    .ok_or_else(|| FdbPageError::Bad(format!("`{name}` is not a port of the switch")))?,
            ),
        };
        let select = Select { port, vlan: query.vlan, mac: query.mac };
        let mut found = Vec::with_capacity(query.limit.min(1024));
        let next = fdb.page(from, query.limit, api::FDB_PAGE_SCAN, select, now, &mut found);
        // Port names once per page, not a lock per entry.
        let names: Vec<Option<Arc<str>>> = {
            let ports = dp.ports.snapshot();
            let mut names = vec![None; ports.last().map_or(0, |(id, _)| id.index() + 1)];
            for (id, info) in ports {
                names[id.index()] = Some(Arc::from(info.name.as_str()));
            }
            names
        };
        let entries = found
            .into_iter()
            .map(|e| FdbEntry {
                vlan: e.vlan.get(),
                mac: e.mac,
                port: names.get(e.port.index()).cloned().flatten(),
                is_static: e.is_static,
                age_seconds: e.age,
            })
            .collect();
        Ok(FdbPage {
            capacity: fdb.capacity(),
            table_entries: fdb.counted(),
            entries,
            next: next.map(|slot| FdbCursor { table: fdb.id(), slot }),
        })
    }

    /// Adds a static entry, removes an entry or flushes entries (the API's FDB edits). Static
    /// entries added here last until they are removed or flushed, or the port goes away; those
    /// of the config follow the config.
    pub fn fdb_change(&self, change: FdbChange) -> Result<serde_json::Value, String> {
        let dp = &self.dataplane;
        // Not on a table a reload is copying into a larger one (the edit would be lost).
        let _edit = dp.fdb.edits().read().unwrap_or_else(|e| e.into_inner());
        let fdb = dp.fdb.get();
        let port_id = |name: &str| dp.ports.id_of(name).ok_or_else(|| format!("`{name}` is not a port of the switch"));
        let vid =
            |v: u16| Vid::new(v).ok_or_else(|| format!("VLAN {v} is out of range: expected {}-{}", Vid::MIN, Vid::MAX));
        match change {
            FdbChange::Add { mac, vlan, port } => {
                let v = vid(vlan)?;
                let id = port_id(&port)?;
                let cfg = self.config();
                let l2 = cfg.port_l2(&port, 1, &|n| dp.ports.id_of(n));
                if !l2.vlan.members.contains(v.get()) {
                    return Err(format!("port `{port}` does not carry VLAN {v}"));
                }
                if let Some(why) = cfg.host_address_elsewhere(mac, &port) {
                    return Err(why);
                }
                fdb.add_static(v, mac, id).map_err(|e| format!("{mac} in VLAN {v}: {e}"))?;
                self.info_changed(
                    "fdb: static entry added",
                    &format!("fdb: static entry {mac} in VLAN {v} on port `{port}` added"),
                );
                Ok(json!({"status": "ok", "added": {"mac": mac.to_string(), "vlan": vlan, "port": port}}))
            }
            FdbChange::Remove { mac, vlan } => {
                let v = vid(vlan)?;
                if !fdb.remove(v, mac) {
                    return Err(format!("no entry for {mac} in VLAN {v}"));
                }
                self.info_changed("fdb: entry removed", &format!("fdb: entry {mac} in VLAN {v} removed"));
                Ok(json!({"status": "ok", "removed": 1}))
            }
            FdbChange::Flush { port, vlan, statics } => {
                let what = Flush {
                    port: port.as_deref().map(port_id).transpose()?,
                    vlan: vlan.map(vid).transpose()?,
                    statics,
                };
                let n = fdb.flush(what);
                let line = format!(
                    "fdb: flushed {n} entries (port {}, VLAN {}, {})",
                    port.as_deref().unwrap_or("any"),
                    vlan.map_or("any".to_string(), |v| v.to_string()),
                    if statics { "static ones too" } else { "learned ones" }
                );
                self.info_changed("fdb: flush", &line);
                Ok(json!({"status": "ok", "removed": n}))
            }
        }
    }

    /// Logs a change (`line`) at INFO, unless one of its `kind` was logged less than
    /// [`crate::api::REFUSAL_LOG_EVERY`] ago: a client with the token adding entries in a loop
    /// wrote a line each. The next line logged of the kind, or the control thread when the
    /// period ends ([`log_overdue`]), says how many were not.
    fn info_changed(&self, kind: &str, line: &str) {
        match self.log_limit.admit(axum::http::StatusCode::OK, kind) {
            Some(0) => log::info!("{line}"),
            Some(n) => log::info!("{line} (and {n} more such since the last such line, not logged)"),
            None => {}
        }
    }

    /// The answer of `GET /api/v1/plugins`.
    pub fn plugins_json(&self) -> serde_json::Value {
        self.plugin_metrics.get().plugins_json()
    }

    /// The answer of `GET /api/v1/shadow`: each port's shadow chain and its verdicts against the
    /// live chain's.
    pub fn shadow_json(&self) -> serde_json::Value {
        self.plugin_metrics.get().shadow_json()
    }

    /// Promotes or discards `port`'s shadow chain: every worker makes the swap between two
    /// rounds (no frame lost, no batch sees half of each chain). The running config follows
    /// (`GET /api/v1/config` shows the promoted chain as `plugins`), the file does not: the
    /// next reload applies the file again. Control thread only (it serialises with reloads).
    pub fn shadow(&self, port: &str, op: ShadowOp) -> ShadowResult {
        self.shadow_change(port, op).map_err(ChangeError::Refused)?
    }

    /// [`Switch::shadow`]: `Err` when refused; `Ok(Err)` when applied, late.
    fn shadow_change(&self, port: &str, op: ShadowOp) -> Result<ShadowResult, String> {
        let cfg = self.config();
        let Some(j) = cfg.port_index(port) else { return Err(format!("`{port}` is not a port of the switch")) };
        // The host port (past the ports) takes no plugins.
        if cfg.ports.get(j).is_none_or(|p| p.shadow.is_empty()) {
            return Err(format!("port `{port}` has no shadow chain (configure `ports[].shadow` and reload)"));
        }
        let dp = &self.dataplane;
        let id = dp.ports.id_of(port).ok_or_else(|| format!("port `{port}` is not running"))?;
        let before = self.plugin_metrics.get();
        // A quarantined shadow plugin's verdicts were its `on_error` policy's, so the comparison
        // says nothing of the plugin: promoting it would put that policy live. Refused by name,
        // as a reload refuses a plugin that faults in its smoke run.
        if matches!(op, ShadowOp::Promote) {
            let quarantined = before
                .plugins
                .iter()
                .find(|r| r.port == port && r.role == Role::Shadow && r.stats.quarantined.get() != 0);
            if let Some(r) = quarantined {
                return Err(format!(
                    "port `{port}`: shadow plugin `{}` is quarantined on worker {} ({} faults), so its verdicts were its on_error policy's; fix it and reload, or discard the shadow chain",
                    r.name(),
                    r.worker,
                    r.stats.faults_total()
                ));
            }
        }
        let compared = before.shadow_json()["ports"].get(0).cloned();
        let sent: Vec<u64> = dp.workers.iter().map(|w| w.control.send_all(vec![Command::Shadow(id, op)])).collect();
        let mut late = Vec::new();
        for (w, (h, g)) in dp.workers.iter().zip(sent).enumerate() {
            if !h.control.wait_applied(g, crate::dataplane::APPLY_BOUND) {
                late.push(w);
            }
            drop(h.control.take_retired());
        }
        // What runs now, and the running config to match.
        let mut next = before.clone();
        let mut new_cfg = (*cfg).clone();
        let p = &mut new_cfg.ports[j];
        let (names, verb) = match op {
            ShadowOp::Promote => {
                // A promoted plugin named like a live one goes on in its counters (as the
                // workers' `ChainStage::promote` does).
                let live: Vec<Running> =
                    next.plugins.iter().filter(|r| r.port == port && r.role == Role::Live).cloned().collect();
                next.plugins.retain(|r| !(r.port == port && r.role == Role::Live));
                for r in next.plugins.iter_mut().filter(|r| r.port == port) {
                    r.role = Role::Live;
                    if let Some(l) = live.iter().find(|l| l.worker == r.worker && l.name() == r.name()) {
                        r.stats = l.stats.clone();
                    }
                }
                p.plugins = std::mem::take(&mut p.shadow);
                (p.plugins.iter().map(|x| x.name.value.clone()).collect::<Vec<_>>(), "promoted")
            }
            ShadowOp::Discard => {
                next.plugins.retain(|r| !(r.port == port && r.role == Role::Shadow));
                (std::mem::take(&mut p.shadow).iter().map(|x| x.name.value.clone()).collect(), "discarded")
            }
        };
        next.shadows.retain(|s| s.port != port);
        self.plugin_metrics.replace(next);
        self.dataplane.set_config(Arc::new(new_cfg));
        let compared = compared.filter(|c| c["port"] == port);
        let line = format!(
            "port `{port}`: shadow chain ({}) {verb}; it had compared {} packets, {} with another verdict than the live chain",
            names.join(", "),
            compared.as_ref().map_or(0, |c| c["packets"].as_u64().unwrap_or(0)),
            compared.as_ref().map_or(0, |c| c["differ"].as_u64().unwrap_or(0)),
        );
        self.info_changed(&format!("port `{port}`: shadow chain {verb}"), &line);
        if !late.is_empty() {
            return Ok(Err(ChangeError::AppliedLate(format!(
                "worker(s) {late:?} did not apply the change within {} s; it is applied when they next complete a round",
                crate::dataplane::APPLY_BOUND.as_secs()
            ))));
        }
        Ok(Ok(json!({
            "status": "ok", "port": port, verb: names, "compared": compared,
            "note": format!("the config file {} still names the chains it had: the next reload applies it again unless you edit it", self.path.display()),
        })))
    }
}

/// Work for the control thread, which runs it in order: reloads and shadow promotions or
/// discards. The answer goes back on the channel (a SIGHUP reload has none).
enum Job {
    Reload(Option<oneshot::Sender<ReloadResult>>),
    Shadow(String, ShadowOp, oneshot::Sender<ShadowResult>),
}

/// One control job (reload, promote, discard) at a time, and a SIGHUP that comes during one
/// kept for after it.
#[derive(Default)]
struct JobGate {
    /// Set while a job is queued or running.
    busy: AtomicBool,
    /// A SIGHUP that no reload has started since: the file may have changed after the running
    /// job's reload read it (or the job is a promote), so one more reload runs after it.
    hup_pending: AtomicBool,
    /// Set once the daemon stops: no job starts after.
    stopping: AtomicBool,
}

impl JobGate {
    /// The control thread, at the end of a job: true when it is to run a reload for a SIGHUP
    /// that came meanwhile (the gate stays taken), false when the gate is free again.
    fn job_done(&self) -> bool {
        loop {
            if self.hup_pending.swap(false, Ordering::AcqRel) && !self.stopping.load(Ordering::Acquire) {
                return true;
            }
            self.busy.store(false, Ordering::Release);
            // A SIGHUP between the two found the gate taken and left its mark: take the gate
            // back for it, unless a request took it first (that job's end finds the mark).
            if !self.hup_pending.load(Ordering::Acquire) || self.busy.swap(true, Ordering::AcqRel) {
                return false;
            }
        }
    }
}

/// What the HTTP API and the signal handlers talk to.
struct Daemon {
    switch: Arc<Switch>,
    metrics: Metrics,
    gate: Arc<JobGate>,
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl Control for Daemon {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn health(&self) -> Result<(), String> {
        self.switch.dataplane.health()
    }

    fn ports_json(&self) -> serde_json::Value {
        self.switch.ports_json()
    }

    fn fdb_page(&self, query: &FdbQuery) -> Result<FdbPage, FdbPageError> {
        self.switch.fdb_page(query)
    }

    fn fdb_change(&self, change: FdbChange) -> Result<serde_json::Value, String> {
        self.switch.fdb_change(change)
    }

    fn plugins_json(&self) -> serde_json::Value {
        self.switch.plugins_json()
    }

    fn config_json(&self) -> serde_json::Value {
        serde_json::to_value(&*self.switch.config()).unwrap_or_default()
    }

    fn token(&self) -> Option<crate::config::Token> {
        self.switch.config().control.token.clone()
    }

    fn shadow_json(&self) -> serde_json::Value {
        self.switch.shadow_json()
    }

    fn start_reload(&self) -> Result<oneshot::Receiver<ReloadResult>, ReloadBusy> {
        let (tx, rx) = oneshot::channel();
        self.queue(Job::Reload(Some(tx)))?;
        Ok(rx)
    }

    fn start_shadow(&self, port: String, op: ShadowOp) -> Result<oneshot::Receiver<ShadowResult>, ReloadBusy> {
        let (tx, rx) = oneshot::channel();
        self.queue(Job::Shadow(port, op, tx))?;
        Ok(rx)
    }
}

impl Daemon {
    /// Hands `job` to the control thread, one at a time.
    fn queue(&self, job: Job) -> Result<(), ReloadBusy> {
        if self.gate.stopping.load(Ordering::Acquire) {
            return Err(ReloadBusy::ShuttingDown);
        }
        if self.gate.busy.swap(true, Ordering::AcqRel) {
            return Err(ReloadBusy::InProgress);
        }
        if self.jobs.lock().unwrap_or_else(|e| e.into_inner()).send(job).is_err() {
            self.gate.busy.store(false, Ordering::Release);
            return Err(ReloadBusy::ShuttingDown);
        }
        Ok(())
    }
}

/// Logs a refused change (`line`, the reason) at WARN, unless the same refusal was logged less
/// than [`crate::api::REFUSAL_LOG_EVERY`] ago; the next line logged of it says how many were
/// not. Any local process may ask for a reload or a promote (no token on loopback), so each
/// refusal writing its own line would let a loop fill the journal.
fn warn_refused(log: &RefusalLog, line: &str) {
    match log.admit(axum::http::StatusCode::UNPROCESSABLE_ENTITY, line) {
        Some(0) => log::warn!("{line}"),
        Some(n) => log::warn!("{line} (and {n} more such refusals since the last such line, not logged)"),
        None => {}
    }
}

/// The control thread: runs jobs one after the other until the job channel closes, and one
/// more reload after a job during which a SIGHUP came.
fn control_loop(switch: Arc<Switch>, gate: Arc<JobGate>, stats: Arc<ControlStats>, jobs: mpsc::Receiver<Job>) {
    let refusals = &switch.log_limit;
    let mut next = next_job(&jobs, refusals);
    while let Some(job) = next.take() {
        let reply = match job {
            Job::Reload(reply) => reply,
            Job::Shadow(port, op, reply) => {
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| switch.shadow(&port, op)))
                    .unwrap_or_else(|_| Err(ChangeError::Refused("it panicked (see the log)".into())));
                let op_name = if matches!(op, ShadowOp::Promote) { "promote" } else { "discard" };
                let outcome = match &result {
                    // Applied, but not everywhere in time: the switch's own trouble.
                    Err(e @ ChangeError::AppliedLate(_)) => {
                        log::error!("port `{port}`: shadow {op_name} {e}");
                        ReloadOutcome::Late
                    }
                    // A refusal changed nothing: the client's to act on, not a fault.
                    Err(e) => {
                        warn_refused(refusals, &format!("port `{port}`: shadow {op_name} refused: {e}"));
                        ReloadOutcome::Refused
                    }
                    Ok(_) => ReloadOutcome::Applied,
                };
                stats.shadow_changed(matches!(op, ShadowOp::Promote), outcome);
                let again = gate.job_done();
                let _ = reply.send(result);
                next = if again { Some(hup_reload()) } else { next_job(&jobs, refusals) };
                continue;
            }
        };
        // This reload reads the file now: it answers every SIGHUP that came before.
        gate.hup_pending.store(false, Ordering::Release);
        crate::notify::reloading();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| switch.reload())).unwrap_or_else(|_| {
            Err(ChangeError::Refused("reload refused: it panicked (see the log); nothing was changed".into()))
        });
        let outcome = match &result {
            // Keyed by what it says: a loop of reloads of one file (any local process may ask,
            // on loopback without a token) wrote a line each.
            Ok(s) => {
                let line = format!("reload: {s}");
                switch.info_changed(&line, &line);
                ReloadOutcome::Applied
            }
            // Applied, but not everywhere in time: the switch's own trouble.
            Err(e @ ChangeError::AppliedLate(_)) => {
                log::error!("reload {e}");
                ReloadOutcome::Late
            }
            // Refused, nothing changed: the file's to fix.
            Err(e) => {
                warn_refused(refusals, &e.to_string());
                ReloadOutcome::Refused
            }
        };
        stats.reloaded(outcome);
        // Applied or refused, the switch runs on.
        crate::notify::notify(match outcome {
            ReloadOutcome::Applied => "READY=1\nSTATUS=reloaded",
            ReloadOutcome::Late => "READY=1\nSTATUS=reloaded (a worker took it late)",
            ReloadOutcome::Refused => "READY=1\nSTATUS=reload refused",
        });
        // The gate is free (or taken for the next reload) before the client hears the answer,
        // so that its next request is not refused as concurrent with this one.
        let again = gate.job_done();
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
        next = if again { Some(hup_reload()) } else { next_job(&jobs, refusals) };
    }
    log_not_logged(refusals.remaining());
}

/// The next job, or `None` once the channel closes. Before and while it waits, the counts of
/// lines not logged are written when their period ends ([`RefusalLog::overdue`]): FDB edits
/// come from the API's threads, so a count must not wait for the control thread to be idle
/// for a whole period.
fn next_job(jobs: &mpsc::Receiver<Job>, refusals: &RefusalLog) -> Option<Job> {
    loop {
        log_overdue(refusals);
        match jobs.recv_timeout(crate::api::REFUSAL_LOG_EVERY) {
            Ok(job) => return Some(job),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Writes the counts of changes and refused changes that [`Switch::info_changed`] and
/// [`warn_refused`] did not log.
fn log_overdue(refusals: &RefusalLog) {
    log_not_logged(refusals.overdue());
}

/// The lines of [`log_overdue`]: changes (2xx) at INFO, refusals at WARN.
fn log_not_logged(counts: Vec<(u16, String, u64)>) {
    for (status, what, n) in counts {
        if (200..300).contains(&status) {
            log::info!("{what} ({n} more such since the last such line, not logged)");
        } else {
            log::warn!("{what} ({n} more such refusals since the last such line, not logged)");
        }
    }
}

/// The reload a SIGHUP that came during another job asks for.
fn hup_reload() -> Job {
    log::info!("SIGHUP: reloading again (it came during the last reload or shadow change)");
    Job::Reload(None)
}

/// How long SIGTERM waits for HTTP requests in flight before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Loads the config at `path`, binds the control API's socket, and drops privileges, reading
/// what needs them first: what `run` does before it starts the switch.
fn prepare(path: &Path) -> Result<(Config, std::net::TcpListener)> {
    let mut config = Config::load(path)?;
    config.read_plugins();
    // Bound before privileges drop, so a port below 1024 works without keeping
    // cap_net_bind_service, and before any port opens, so a taken address fails fast.
    let listen = config.listen_addr();
    let std_listener =
        std::net::TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen} (metrics.listen)"))?;
    std_listener.set_nonblocking(true)?;
    let user = config.user.as_ref().map(|u| u.value.as_str());
    // The plugin cache's key is read (or made) now, while the daemon is still the user it was
    // started as: after the drop, any other process of `user` could read what `user` can.
    crate::plugins::load_cache_key(user.and_then(|u| crate::privileges::lookup(u).ok()).map(|(uid, _)| uid));
    let dropped = crate::privileges::drop_privileges(user).context("cannot drop privileges")?;
    log::info!("{dropped}");
    // Read before the drop; a reload reads them again as the user the daemon now is.
    for file in config.files_reread() {
        if let Err(e) = std::fs::File::open(&file) {
            log::warn!(
                "{}: cannot be read after dropping privileges ({e}): every reload will fail; make it readable by the daemon's user",
                file.display()
            );
        }
    }
    for w in config.interface_warnings() {
        log::warn!("{w}");
    }
    Ok((config, std_listener))
}

/// Runs the daemon until SIGINT or SIGTERM, then drains the workers and checks every frame
/// came back. SIGHUP reloads.
pub fn run(path: &Path) -> Result<()> {
    // The control runtime (one thread, this one: it spawns none that would keep privileges the
    // drop below takes from this thread) and the SIGHUP handler come first: SIGHUP's default
    // action ends the process, and starting (compiling plugins, opening ports) takes seconds.
    // A SIGHUP that comes meanwhile is kept and reloads once the switch runs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control runtime")?;
    let mut hup = {
        let _in_runtime = rt.enter();
        signal(SignalKind::hangup())?
    };
    let (config, std_listener) = prepare(path)?;
    let switch = Arc::new(Switch::start_with(path, config)?);
    let config = switch.config();
    let addr = config.listen_addr();
    log::info!(
        "wasmswitch running: {} port(s), {} worker(s), {} frames of {} bytes",
        config.ports.len(),
        config.workers.len(),
        config.pool.frames.value,
        config.pool.frame_size.value
    );
    let control_stats = Arc::new(ControlStats::default());
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
    let gate = Arc::new(JobGate::default());
    let daemon = Arc::new(Daemon {
        metrics: Metrics::new({
            let mut c = switch.collector();
            c.extra.push(control_stats.clone());
            c
        }),
        switch: switch.clone(),
        gate: gate.clone(),
        jobs: Mutex::new(jobs_tx),
    });
    {
        let switch = switch.clone();
        // Detached on purpose: shutdown does not wait for a reload that is compiling.
        std::thread::Builder::new()
            .name("control".into())
            .spawn({
                let stats = control_stats.clone();
                move || control_loop(switch, gate, stats, jobs_rx)
            })
            .context("cannot start the control thread")?;
    }
    let state = ApiState::new(daemon.clone(), addr, control_stats.clone());
    let served = rt.block_on(async {
        let listener = tokio::net::TcpListener::from_std(std_listener).context("the control API's socket")?;
        log::info!("metrics and control API on http://{addr}/metrics");
        crate::notify::notify("READY=1\nSTATUS=forwarding");
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let limits = Limits { shutdown_grace: SHUTDOWN_GRACE, ..Limits::default() };
        let refusals = state.refusals.clone();
        tokio::spawn(crate::api::log_overdue_refusals(refusals.clone()));
        let mut server = tokio::spawn(crate::api::serve(listener, router(state), limits, control_stats, stop_rx));
        loop {
            tokio::select! {
                _ = term.recv() => { log::info!("SIGTERM: draining"); break; }
                _ = int.recv() => { log::info!("SIGINT: draining"); break; }
                _ = hup.recv() => {
                    // Marked first: whichever reload starts next answers it, this one's or one
                    // the control thread runs after the job under way (see `JobGate`).
                    let marked = daemon.gate.hup_pending.swap(true, Ordering::AcqRel);
                    match daemon.queue(Job::Reload(None)) {
                        // The control thread logs the result.
                        Ok(_) => log::info!("SIGHUP: reloading {}", path.display()),
                        // Said once per job: a burst of signals asks for one reload.
                        Err(ReloadBusy::InProgress) if !marked => {
                            log::info!("SIGHUP during a reload or shadow change: one more reload follows it")
                        }
                        Err(ReloadBusy::InProgress) => {}
                        Err(ReloadBusy::ShuttingDown) => {}
                    }
                }
                r = &mut server => {
                    log::error!("control API stopped: {r:?}");
                    break;
                }
            }
        }
        crate::notify::notify("STOPPING=1");
        daemon.gate.stopping.store(true, Ordering::Release);
        let _ = stop_tx.send(true);
        // The server bounds its own drain; this bound is the backstop.
        let _ = tokio::time::timeout(SHUTDOWN_GRACE * 2, server).await;
        // The last burst's counts, their periods over or not.
        crate::api::log_not_logged(refusals.remaining());
        log_not_logged(daemon.switch.log_limit.remaining());
        anyhow::Ok(())
    });
    // Drops whatever connection tasks are left without waiting for them.
    rt.shutdown_background();
    // The datapath stops even if the API failed to start.
    let stopped = switch.dataplane.stop_shared();
    served?;
    stopped?;
    log::info!("stopped cleanly: all {} frames are back in the pool", switch.dataplane.total_frames());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sighup_during_a_job_gets_one_reload_after_it_and_the_gate_frees_once_none_is_left() {
        let gate = JobGate::default();
        gate.busy.store(true, Ordering::Release);
        assert!(!gate.job_done(), "no SIGHUP: nothing more");
        assert!(!gate.busy.load(Ordering::Acquire), "the gate is free");

        gate.busy.store(true, Ordering::Release);
        // Three SIGHUPs during the job: one reload after it, the gate still taken for it.
        for _ in 0..3 {
            gate.hup_pending.store(true, Ordering::Release);
        }
        assert!(gate.job_done());
        assert!(gate.busy.load(Ordering::Acquire), "taken for the reload");
        assert!(!gate.job_done(), "that reload answered them all");
        assert!(!gate.busy.load(Ordering::Acquire));

        // Stopping: a SIGHUP left over starts nothing.
        gate.busy.store(true, Ordering::Release);
        gate.hup_pending.store(true, Ordering::Release);
        gate.stopping.store(true, Ordering::Release);
        assert!(!gate.job_done());
        assert!(!gate.busy.load(Ordering::Acquire));
    }
}
