//! `wasmswitch run`: the daemon's lifecycle (start, serve, reload, drain, exit).
//!
//! Three kinds of threads: the datapath workers, the HTTP/signal thread (a current-thread tokio
//! runtime on the main thread) and one control thread that runs reloads. A reload compiles
//! plugins for as long as it takes without holding anything the HTTP handlers or the shutdown
//! path need, so `/healthz` and `/metrics` answer and SIGTERM ends the daemon while it runs.

use std::collections::HashMap;
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
use wasmswitch_core::wire::MacAddr;
use wasmswitch_core::PortId;

use crate::api::{
    self, router, ApiState, ChangeError, Control, ControlStats, FdbChange, FdbCursor, FdbEntry, FdbPage, FdbPageError,
    FdbQuery, Limits, RefusalLog, ReloadBusy, ReloadOutcome, ReloadResult, ShadowResult,
};
use crate::config::diff::Plan;
use crate::config::l2::StaticEntry;
use crate::config::{Config, PortSection};
use crate::dataplane::{storm_share, AddPort, Command, Dataplane, PortChanges, ShadowOp};
use crate::error_text::ErrorText;
use crate::metrics::{Metrics, SwitchCollector};
use crate::plugins::{Role, Running, Smoke};

/// The running switch: its config and datapath.
pub struct Switch {
    pub path: PathBuf,
    pub dataplane: Dataplane,
    pub plugin_metrics: Arc<crate::plugins::PluginMetrics>,
    /// Rate limit of the lines of changes and refused changes (FDB edits, reloads, shadow
    /// changes): one per kind every [`crate::api::REFUSAL_LOG_EVERY`], then a count.
    pub log_limit: RefusalLog,
}

impl Switch {
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

    pub fn ports_json(&self) -> serde_json::Value {
        let dp = &self.dataplane;
        let ports: Vec<_> = dp
            .ports
            .snapshot()
            .into_iter()
            .map(|(p, info)| {
                let sum = |f: &dyn Fn(&wasmswitch_core::stats::PortStats) -> u64| -> u64 {
                    dp.workers.iter().map(|w| f(&w.stats.ports[p as usize])).sum()
                };
                json!({
                    "id": p,
                    "name": info.name,
                    "driver": info.driver,
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
            let mut names = vec![None; ports.last().map_or(0, |(id, _)| *id as usize + 1)];
            for (id, info) in ports {
                names[id as usize] = Some(Arc::from(info.name.as_str()));
            }
            names
        };
        let entries = found
            .into_iter()
            .map(|e| FdbEntry {
                vlan: e.vlan,
                mac: e.mac,
                port: names.get(e.port as usize).cloned().flatten(),
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
                fdb.add_static(v.get(), mac, id).map_err(|e| format!("{mac} in VLAN {v}: {e}"))?;
                self.info_changed(
                    "fdb: static entry added",
                    &format!("fdb: static entry {mac} in VLAN {v} on port `{port}` added"),
                );
                Ok(json!({"status": "ok", "added": {"mac": mac.to_string(), "vlan": vlan, "port": port}}))
            }
            FdbChange::Remove { mac, vlan } => {
                let v = vid(vlan)?;
                if !fdb.remove(v.get(), mac) {
                    return Err(format!("no entry for {mac} in VLAN {v}"));
                }
                self.info_changed("fdb: entry removed", &format!("fdb: entry {mac} in VLAN {v} removed"));
                Ok(json!({"status": "ok", "removed": 1}))
            }
            FdbChange::Flush { port, vlan, statics } => {
                let what = Flush {
                    port: port.as_deref().map(port_id).transpose()?,
                    vlan: vlan.map(vid).transpose()?.map(Vid::get),
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

    pub fn plugins_json(&self) -> serde_json::Value {
        self.plugin_metrics.get().plugins_json()
    }

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

    /// Re-reads the config file and applies it, or refuses it and changes nothing.
    ///
    /// Applied live (see [`crate::config::diff::applies_live`]): ports added and removed
    /// (matched by name; an AF_XDP port's sockets are opened before anything changes and a
    /// removed one's closed once every worker has let go of it), a sim port's settings (its
    /// queues replaced), `mtu`, the plugin chains (always recompiled from their files, which
    /// may have changed even when the config did not; a plugin that stays on its port
    /// keeps its counters and is let out of quarantine), `workers[].idle`, `switch.batch` (every
    /// live plugin first passes the smoke run at the new size), `fdb.capacity` (a new table with
    /// the learned entries copied in) and `fdb.aging_seconds`.
    /// Workers take every change of one reload together between two rounds, so the ports it
    /// does not touch lose no frame. Any other changed key refuses the whole reload, naming
    /// each such key with its place in the file; the running config stays.
    ///
    /// Slow (compiles plugins, opens sockets): call it from the control thread, never from an
    /// HTTP handler.
    /// True when `c` is a change of `ports[j].umem` that leaves running port `j` in the UMEM
    /// group it is in (its default written out, or the reverse).
    fn same_umem_group(&self, c: &crate::config::diff::Change, new: &Config) -> bool {
        let Some(j) = c.key.strip_prefix("ports[").and_then(|r| r.strip_suffix("].umem")) else { return false };
        let Some(port) = j.parse::<usize>().ok().and_then(|j| new.ports.get(j)) else { return false };
        let dp = &self.dataplane;
        dp.ports
            .id_of(&port.name.value)
            .and_then(|id| dp.ports.get(id))
            .is_some_and(|running| running.umem == crate::dataplane::umem_group_of(port))
    }

    pub fn reload(&self) -> ReloadResult {
        match self.reload_change().map_err(ChangeError::Refused)? {
            (summary, None) => Ok(summary),
            (summary, Some(late)) => Err(ChangeError::AppliedLate(format!("{late}; {summary}"))),
        }
    }

    /// [`Switch::reload`]: `Err` when refused (nothing changed); the summary of what was
    /// applied, and why it was late if it was.
    fn reload_change(&self) -> Result<(String, Option<String>), String> {
        const UNCHANGED: &str = "reload refused, nothing was changed";
        let new = Config::load(&self.path).map_err(|e| format!("{UNCHANGED}: {e}"))?;
        let old = self.config();
        let Plan { live, mut restart } = crate::config::diff::plan(&old, &new);
        // A port's `umem:` written out as the group it is already in changes nothing.
        restart.retain(|c| !self.same_umem_group(c, &new));
        if !restart.is_empty() {
            let keys: Vec<String> = restart.iter().map(|c| c.to_string()).collect();
            return Err(format!(
                "{UNCHANGED}: {} changed key(s) take effect only at a restart: {}",
                restart.len(),
                keys.join("; ")
            ));
        }
        let dp = &self.dataplane;
        let refuse = |e: anyhow::Error| format!("{UNCHANGED}: {}", ErrorText(&e));
        // Ports, matched by name: removed, added (new ids), replaced (same id, new queues).
        let named = |c: &Config, n: &str| c.ports.iter().position(|p| p.name.value == n);
        let removed: Vec<PortId> = old
            .ports
            .iter()
            .filter(|p| named(&new, &p.name.value).is_none())
            .filter_map(|p| dp.ports.id_of(&p.name.value))
            .collect();
        let added: Vec<usize> =
            (0..new.ports.len()).filter(|&j| named(&old, &new.ports[j].name.value).is_none()).collect();
        // A renamed port is one removed and one added, and a reload opens the new before it
        // closes the old: on one interface that meets the old port's XDP program.
        let interface = |p: &crate::config::PortSection| p.afxdp.as_ref().map(|a| a.value.interface.value.clone());
        for &j in &added {
            let Some(i) = interface(&new.ports[j]) else { continue };
            let leaving =
                old.ports.iter().find(|p| named(&new, &p.name.value).is_none() && interface(p) == Some(i.clone()));
            if let Some(gone) = leaving {
                return Err(format!(
                    "{UNCHANGED}: port `{}` on {i} takes the place of port `{}` there, and a reload opens new ports before it closes old ones: remove `{}` in one reload and add `{}` in the next, or restart",
                    new.ports[j].name.value, gone.name.value, gone.name.value, new.ports[j].name.value
                ));
            }
        }
        let replaced: Vec<usize> = (0..new.ports.len())
            .filter(|&j| {
                named(&old, &new.ports[j].name.value).is_some_and(|i| needs_new_queues(&old.ports[i], &new.ports[j]))
            })
            .collect();
        let mut ids: HashMap<String, PortId> = dp
            .ports
            .snapshot()
            .into_iter()
            .filter(|(id, _)| !removed.contains(id))
            .map(|(id, p)| (p.name.clone(), id))
            .collect();
        for (&j, id) in added.iter().zip(dp.free_ids(&removed, added.len()).map_err(refuse)?) {
            ids.insert(new.ports[j].name.value.clone(), id);
        }
        let id_of = |n: &str| ids.get(n).copied();
        // `cross` pairs ports by id (0↔1, 2↔3, …), which at a start is their place in the file.
        // Ids stay with their ports across reloads, so a reload that would pair them otherwise
        // than the file does (ports reordered, or one removed before others) is refused.
        if new.switch.mode == crate::config::Mode::Cross {
            let name_of =
                |id: PortId| new.ports.iter().find(|p| id_of(&p.name.value) == Some(id)).map(|p| &p.name.value);
            for (j, p) in new.ports.iter().enumerate() {
                let id = id_of(&p.name.value).expect("every port of the new config has an id");
                let in_file = new.ports.get(j ^ 1).map(|q| &q.name.value);
                let running = name_of(id ^ 1);
                if in_file != running {
                    let said = |n: Option<&String>| n.map_or("no port".to_string(), |n| format!("`{n}`"));
                    return Err(format!(
                        "{UNCHANGED}: switch.mode cross pairs ports by their place in the file (0↔1, 2↔3, …): port `{}` pairs with {} in the file but would run paired with {} (ports keep their numbers across reloads); this order needs a restart",
                        p.name.value,
                        said(in_file),
                        said(running)
                    ));
                }
            }
        }
        // Plugins compiled and ports opened before anything changes: an error here leaves
        // everything as it was (opened ports are closed again when dropped).
        // The running plugins' counters: a plugin that stays (same port and name) keeps
        // counting into them, so /metrics never sees a counter go backwards.
        let running = self.plugin_metrics.get();
        let batch_changed = old.switch.batch.value != new.switch.batch.value;
        let smoke = if batch_changed { Smoke::All } else { Smoke::Changed };
        let (mut stages, next) = crate::plugins::stages(&new, &id_of, &running, smoke).map_err(refuse)?;
        // From here to the end the datapath changes: a stop waits for it, or refuses it.
        let _changing = dp.begin_change().map_err(refuse)?;
        let mut changes = PortChanges::default();
        for &j in added.iter().chain(&replaced) {
            let port = dp.open_port(&new, j, &id_of).map_err(refuse)?;
            let id = id_of(&new.ports[j].name.value).expect("every port of the new config has an id");
            let fresh = added.contains(&j);
            if !fresh {
                changes.remove.push(id);
            }
            changes.add.push(AddPort { id, port, fresh, stages: Vec::new() });
        }
        changes.remove.extend(&removed);
        // No API edit or aging of the table from here to the new config in place (see
        // `CurrentFdb::edits`).
        let no_edits = dp.fdb.edits().write().unwrap_or_else(|e| e.into_inner());
        // The config's static FDB entries: the ones no longer there go, new ones come. Whether
        // they fit (at the new capacity, the API's entries included) is asked first, so that one
        // that does not refuses the reload before anything changes.
        let key = |e: &StaticEntry| (e.vlan.value, e.mac.value.0, e.port.value.clone());
        let (was, now): (Vec<_>, Vec<_>) =
            (old.fdb.statics.iter().map(key).collect(), new.fdb.statics.iter().map(key).collect());
        let gone_statics: Vec<_> = was.iter().filter(|e| !now.contains(e)).collect();
        let new_statics: Vec<_> = now.iter().filter(|e| !was.contains(e)).collect();
        // The table's static entries, the file's and the API's, by (VLAN, MAC).
        let statics_now: Vec<_> = dp.fdb.get().entries(0).into_iter().filter(|e| e.is_static).collect();
        let in_table = |v: u16, m: MacAddr| statics_now.iter().find(|e| (e.vlan, e.mac) == (v, m));
        let port_in_table = |v: u16, m: MacAddr| dp.ports.get(in_table(v, m)?.port).map(|i| i.name.clone());
        // The file's statics follow the file: one the file still has but the table lost (an
        // API delete or flush took it) comes back. One the API put on another port stays there.
        let restored: Vec<_> = now.iter().filter(|e| was.contains(e) && in_table(e.0, e.1).is_none()).collect();
        // A new one for an address the API has put on another port would replace that entry
        // unseen: refused by name. The old file's own entry leaving now (a move) is no conflict.
        for (v, m, p) in &new_statics {
            let (Some(e), Some(there)) = (in_table(*v, *m), port_in_table(*v, *m)) else { continue };
            let leaving =
                removed.contains(&e.port) || gone_statics.iter().any(|g| (g.0, g.1) == (*v, *m) && g.2 == there);
            if there != *p && !leaving {
                return Err(format!(
                    "{UNCHANGED}: fdb.static {m} in VLAN {v} on `{p}`: the table has a static entry for it on `{there}`, added through the API; delete it first (`wasmswitch fdb del {m} --vlan {v}`)"
                ));
            }
        }
        // New ones the API had already put on the same port: the file's from now on.
        let adopted: Vec<_> =
            new_statics.iter().filter(|(v, m, p)| port_in_table(*v, *m).as_ref() == Some(p)).copied().collect();
        let adding: Vec<_> = new_statics.iter().chain(&restored).copied().collect();
        if !adding.is_empty() || old.fdb.capacity.value != new.fdb.capacity.value {
            let ids = |list: &[&(u16, MacAddr, String)], of: &dyn Fn(&str) -> Option<PortId>| {
                list.iter().filter_map(|(v, m, p)| Some((*v, *m, of(p)?))).collect::<Vec<_>>()
            };
            let (remove, add) = (ids(&gone_statics, &|p| dp.ports.id_of(p)), ids(&adding, &id_of));
            dp.fdb
                .get()
                .statics_fit(new.fdb.capacity.value, &remove, &removed, &add)
                .map_err(|e| format!("{UNCHANGED}: fdb.static: {e}"))?;
        }
        // Every static entry that stays (the API's too) must stay inside its port's VLANs: one
        // the new VLAN settings would leave outside (a black hole: never moved, never aged)
        // refuses the reload by name. The config's own are checked with the file.
        for e in dp.fdb.get().entries(0).into_iter().filter(|e| e.is_static && !removed.contains(&e.port)) {
            let Some(info) = dp.ports.get(e.port) else { continue };
            let gone = gone_statics.iter().any(|(v, m, p)| (*v, *m) == (e.vlan, e.mac) && *p == info.name);
            if !gone && !new.port_l2(&info.name, 1, &id_of).vlan.members.contains(e.vlan) {
                return Err(format!(
                    "{UNCHANGED}: fdb: the static entry {} in VLAN {} on `{}` would be outside the port's VLANs; delete it first (`wasmswitch fdb del {} --vlan {}`)",
                    e.mac, e.vlan, info.name, e.mac, e.vlan
                ));
            }
        }
        // From here on nothing can fail but a worker that does not answer.
        let mut applied = Vec::new();
        let mut extra: Vec<Vec<Command>> = Vec::new();
        for (w, worker_stages) in stages.iter_mut().enumerate() {
            let mut cmds = Vec::new();
            for (id, stage) in worker_stages.drain(..) {
                match changes.add.iter_mut().find(|a| a.id == id) {
                    Some(a) => {
                        a.stages.resize_with(w + 1, || None);
                        a.stages[w] = stage;
                    }
                    None => cmds.push(Command::SetIngress(id, stage)),
                }
            }
            if batch_changed {
                cmds.push(Command::SetBatch(new.switch.batch.value));
            }
            if let (Some(a), Some(b)) = (old.workers.get(w), new.workers.get(w)) {
                if a.idle.value != b.idle.value {
                    cmds.push(Command::SetIdle(b.idle.value));
                }
                let cpu = |x: &crate::config::WorkerSection| x.cpu.as_ref().map(|c| c.value);
                if cpu(a) != cpu(b) {
                    cmds.push(Command::Pin(cpu(b)));
                    applied.push(match cpu(b) {
                        Some(c) => format!("workers[{w}] pinned to cpu {c}"),
                        None => format!("workers[{w}] unpinned"),
                    });
                }
            }
            extra.push(cmds);
        }
        for (j, port) in new.ports.iter().enumerate() {
            let Some(i) = named(&old, &port.name.value) else { continue };
            if old.ports[i].mtu.value != port.mtu.value && !replaced.contains(&j) {
                let id = id_of(&port.name.value).expect("a running port has an id");
                let mtu = port.mtu.value;
                let veth = dp.ports.get(id).is_some_and(|i| i.veth);
                let (max, tx_max) = (crate::drivers::max_frame(mtu), crate::drivers::max_tx_frame(mtu, veth));
                for cmds in &mut extra {
                    cmds.push(Command::SetMaxFrame(id, max, tx_max));
                }
                applied.push(format!("port `{}`: mtu {}", port.name.value, port.mtu.value));
            }
        }
        for p in old.ports.iter().filter(|p| named(&new, &p.name.value).is_none()) {
            applied.push(format!("port `{}` removed", p.name.value));
        }
        for &j in &added {
            applied.push(format!("port `{}` added", new.ports[j].name.value));
        }
        for &j in &replaced {
            applied.push(format!("port `{}` reopened with its new settings", new.ports[j].name.value));
        }
        // VLANs, storm limits and mirrors of the ports that stay (added and reopened ones got
        // theirs when opened): every worker gets the new settings of each port they changed for.
        let old_id_of = |n: &str| dp.ports.id_of(n);
        // Ports that left VLANs: their learned entries in those go once the workers have the new
        // settings (as the bridge flushes a port's entries of a VLAN it leaves); until they
        // aged out, they would send frames for those hosts nowhere.
        let mut relearn = Vec::new();
        for name in new.ports.iter().map(|p| &p.name.value).chain(new.host.as_ref().map(|h| &h.name.value)) {
            let j = named(&new, name);
            if j.is_some_and(|j| added.contains(&j) || replaced.contains(&j)) {
                continue;
            }
            let Some((id, info)) = id_of(name).and_then(|id| Some((id, dp.ports.get(id)?))) else { continue };
            let (a, b) = (
                old.port_l2(name, storm_share(&info, &old), &old_id_of),
                new.port_l2(name, storm_share(&info, &new), &id_of),
            );
            if a != b {
                for cmds in &mut extra {
                    cmds.push(Command::SetL2(id, b.clone()));
                }
                // Only the VLANs it left: its entries in those it keeps still hold (a PVID
                // change or an added VLAN flushes nothing, as on the bridge).
                let left = a.vlan.members.iter().filter(|v| !b.vlan.members.contains(v.get())).count();
                if left > 0 {
                    relearn.push((id, b.vlan.members.clone()));
                }
                // A mirror's destination carries no VLAN: becoming one is leaving them all.
                let why = if !a.mirror_destination && b.mirror_destination {
                    "flushed: it became a mirror's destination".to_string()
                } else if left == 1 {
                    "in the VLAN it left flushed".to_string()
                } else {
                    format!("in the {left} VLANs it left flushed")
                };
                applied.push(format!(
                    "port `{name}`: VLANs, storm control and mirrors as configured{}",
                    if left > 0 { format!(" (its learned FDB entries {why})") } else { String::new() }
                ));
            }
        }
        // The port ids of the old config's statics, before a removed port's id goes.
        let gone_statics: Vec<_> = gone_statics.into_iter().map(|e| (e, dp.ports.id_of(&e.2))).collect();
        let mut late = dp.change_ports(changes, extra);
        for (id, kept) in relearn {
            dp.fdb.get().flush_port_outside(id, &kept);
        }
        // Removals, the new capacity, additions: the order `statics_fit` counted in.
        for ((vlan, mac, port), id) in gone_statics {
            // Only the config's own entry: an API entry for the same address on another port
            // stays (a removed port's entries went with it).
            let Some(id) = id else { continue };
            let what = if removed.contains(&id) {
                "removed with its port"
            } else if dp.fdb.get().remove_static(*vlan, *mac, id) {
                "removed"
            } else {
                "left the config (the table no longer had it there)"
            };
            applied.push(format!("fdb.static {mac} in VLAN {vlan} on `{port}` {what}"));
        }
        if old.fdb.capacity.value != new.fdb.capacity.value {
            let dropped = || dp.fdb.get().stats.resize_dropped.get();
            let before = dropped();
            let r = dp.resize_fdb(new.fdb.capacity.value, &no_edits);
            late = late.and(r);
            let fdb = dp.fdb.get();
            let lost = match dropped() - before {
                0 => "every entry copied over".to_string(),
                n => format!("{n} learned entries it had no room for dropped, the stalest"),
            };
            applied.push(format!(
                "fdb.capacity = {} (a table of {} entries, {} in it; {lost})",
                new.fdb.capacity.value,
                fdb.capacity(),
                fdb.len()
            ));
        }
        let fdb = dp.fdb.get();
        for (vlan, mac, port) in adding {
            let r = id_of(port)
                .context("no such port")
                .and_then(|id| fdb.add_static(*vlan, *mac, id).map_err(|e| anyhow::anyhow!("{e}")));
            let how = if restored.contains(&&(*vlan, *mac, port.clone())) {
                "restored (it had been deleted from the table)"
            } else if adopted.contains(&&(*vlan, *mac, port.clone())) {
                "added (the API's entry there, now the file's)"
            } else {
                "added"
            };
            match r {
                Ok(()) => applied.push(format!("fdb.static {mac} in VLAN {vlan} on `{port}` {how}")),
                // Only if the table changed since `statics_fit` (an API edit meanwhile).
                Err(e) => late = late.and(Err(e.context(format!("fdb.static {mac} in VLAN {vlan} was not added")))),
            }
        }
        // Each port's limit on learned entries, on the table now in use (a resize copied the
        // old limits): a removed port's id goes back to none, before an added port may take it.
        for &id in &removed {
            fdb.set_max_learned(id, 0);
        }
        for port in &new.ports {
            let name = &port.name.value;
            let Some(id) = id_of(name) else { continue };
            let max = new.max_macs(name);
            fdb.set_max_learned(id, max);
            if named(&old, name).is_some() && old.max_macs(name) != max {
                applied.push(match max {
                    0 => format!("port `{name}`: fdb.max_macs off (no limit on its learned entries)"),
                    n => format!(
                        "port `{name}`: fdb.max_macs = {n} (it has {} learned entries; those above the limit stay until they age)",
                        fdb.learned_on(id)
                    ),
                });
            }
        }
        for port in &new.ports {
            let name = &port.name.value;
            let before = named(&old, name).map(|i| &old.ports[i]);
            if port.plugins.is_empty()
                && port.shadow.is_empty()
                && before.is_none_or(|b| b.plugins.is_empty() && b.shadow.is_empty())
            {
                continue;
            }
            // Worker 0 stands for all: every worker gets the same chains.
            let list = |role: Role| {
                let l: Vec<String> = next
                    .plugins
                    .iter()
                    .filter(|r| &r.port == name && r.role == role && r.worker == 0)
                    .map(|r| format!("{}{}", r.name(), if running.keeps(r) { " kept with its state" } else { "" }))
                    .collect();
                if l.is_empty() {
                    "none".to_string()
                } else {
                    l.join(", ")
                }
            };
            let shadow = if port.shadow.is_empty() && before.is_none_or(|b| b.shadow.is_empty()) {
                String::new()
            } else {
                format!("; shadow: {}", list(Role::Shadow))
            };
            applied.push(format!("plugins of port `{name}` reloaded from their files ({}{shadow})", list(Role::Live)));
        }
        self.plugin_metrics.replace(next);
        for (w, (a, b)) in old.workers.iter().zip(&new.workers).enumerate() {
            if a.idle.value != b.idle.value {
                applied.push(format!("workers[{w}].idle = {:?}", b.idle.value).to_lowercase());
            }
        }
        if batch_changed {
            applied.push(format!(
                "switch.batch = {} (every live plugin passed the smoke run at that size)",
                new.switch.batch.value
            ));
        }
        if old.fdb.aging_seconds.value != new.fdb.aging_seconds.value {
            // The FDB's ticks are seconds (the workers' clock is start.elapsed() in seconds).
            dp.fdb.get().set_aging_ticks(new.fdb.aging_seconds.value);
            applied.push(format!("fdb.aging_seconds = {}", new.fdb.aging_seconds.value));
        }
        for (j, b) in new.ports.iter().enumerate() {
            let Some(a) = named(&old, &b.name.value).map(|i| &old.ports[i]) else { continue };
            if replaced.contains(&j) {
                continue;
            }
            // Only rate to rate gets here (anything else replaces the port's queues).
            if let (Some(r0), Some(r1)) = (rate(a), rate(b)) {
                if r0 != r1 {
                    let info = id_of(&b.name.value).and_then(|id| dp.ports.get(id));
                    for h in info.iter().flat_map(|i| &i.sim_rates) {
                        h.store(r1, Ordering::Relaxed);
                    }
                    applied.push(format!("port `{}`: sim traffic rate_pps = {r1}", b.name.value));
                }
            }
        }
        // The token file is re-read at every reload, so its path need not change for this.
        let token = |c: &Config| c.control.token.as_ref().map(|t| t.as_bytes().to_vec());
        if token(&old) != token(&new) {
            applied.push(match new.control.token {
                Some(_) => "control API token: the one now in the token file".to_string(),
                None => "control API token: none".to_string(),
            });
        }
        let changed: Vec<String> = live.iter().map(|c| c.to_string()).collect();
        // Plugins see ports by id (`in-port`, `redirect`). A start numbers them by their place in
        // the file; a reload keeps running ports' ids and gives added ports the lowest free
        // ones. Where the two part, the same file would number ports otherwise after a restart:
        // said in the answer and the log, since plugin configs naming port ids are affected.
        let renumbered: Vec<String> = new
            .ports
            .iter()
            .enumerate()
            .filter_map(|(j, p)| {
                let id = id_of(&p.name.value).filter(|&id| id as usize != j)?;
                Some(format!("`{}` runs as {id}, a restart numbers it {j}", p.name.value))
            })
            .collect();
        let note = if renumbered.is_empty() || new.ports.iter().all(|p| p.plugins.is_empty() && p.shadow.is_empty()) {
            String::new()
        } else {
            let note = format!(
                "; note: plugins see ports by id, and the file's order no longer gives the running ids: {}; \
                 port ids in plugin configs follow the running ids until a restart",
                renumbered.join(", ")
            );
            log::warn!("reload{note}");
            note
        };
        self.dataplane.set_config(Arc::new(new));
        drop(no_edits);
        let summary = format!(
            "applied: {}; changed keys: {}; everything else unchanged{note}",
            if applied.is_empty() { "nothing (no plugins, no change)".to_string() } else { applied.join("; ") },
            if changed.is_empty() { "none".to_string() } else { changed.join("; ") },
        );
        Ok((summary, late.err().map(|e| ErrorText(&e).to_string())))
    }
}

/// A sim port's generator rate, when it has a rate-limited one.
fn rate(p: &PortSection) -> Option<u64> {
    p.sim.as_ref().and_then(|s| s.value.traffic.as_ref()).and_then(|t| t.rate_pps.as_ref()).map(|r| r.value)
}

/// True when a port that stays (same name) needs its queues replaced: anything but its plugins,
/// its mtu and a rate-to-rate change of its generator differs.
fn needs_new_queues(a: &PortSection, b: &PortSection) -> bool {
    let strip = |p: &PortSection| {
        let mut v = serde_json::to_value(p).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("plugins");
            o.remove("shadow");
            o.remove("mtu");
            // Applied to the running slots (`Command::SetL2`).
            o.remove("vlan");
            o.remove("storm");
            // Applied to the table (`Fdb::set_max_learned`).
            o.remove("fdb");
            // A change of UMEM group is a restart key, refused before this; what is left is the
            // group a port is already in written out (or the reverse), which changes nothing.
            // Reopened, an AF_XDP port would find its own XDP program on the interface.
            o.remove("umem");
        }
        if rate(p).is_some() {
            if let Some(r) = v.pointer_mut("/sim/traffic/rate_pps") {
                *r = serde_json::Value::Null;
            }
        }
        v
    };
    let same_pacing = rate(a).is_some() == rate(b).is_some();
    strip(a) != strip(b) || !same_pacing
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
