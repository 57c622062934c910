//! `wasmswitch run`: the daemon's lifecycle (start, serve, reload, drain, exit).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

use crate::api::{router, ApiState};
use crate::config::Config;
use crate::dataplane::Dataplane;
use crate::metrics::{Metrics, SwitchCollector};

/// The running switch: its config and datapath, shared with the control API.
pub struct Switch {
    pub path: PathBuf,
    pub config: Config,
    pub dataplane: Dataplane,
    pub plugin_metrics: Arc<crate::plugins::PluginMetrics>,
}

impl Switch {
    pub fn start(path: &Path) -> Result<Switch> {
        let config = Config::load(path)?;
        let plugin_metrics = Arc::new(crate::plugins::PluginMetrics::default());
        let dataplane = Dataplane::start_with_plugins(&config, path, Some(&plugin_metrics))?;
        Ok(Switch { path: path.to_owned(), config, dataplane, plugin_metrics })
    }

    pub fn collector(&self) -> SwitchCollector {
        let dp = &self.dataplane;
        SwitchCollector {
            ports: dp.ports.clone(),
            workers: dp.workers.iter().map(|w| w.stats.clone()).collect(),
            pool: dp.pool.clone(),
            fdb: dp.fdb.clone(),
            start: dp.start,
            extra: vec![self.plugin_metrics.clone() as Arc<dyn crate::metrics::MetricsSource>],
        }
    }

    pub fn ports_json(&self) -> serde_json::Value {
        let dp = &self.dataplane;
        let ports: Vec<_> = dp
            .ports
            .iter()
            .enumerate()
            .map(|(p, info)| {
                let sum = |f: &dyn Fn(&wasmswitch_core::stats::PortStats) -> u64| -> u64 {
                    dp.workers.iter().map(|w| f(&w.stats.ports[p])).sum()
                };
                json!({
                    "name": info.name,
                    "driver": info.driver,
                    "mode": info.mode,
                    "queues": info.queues,
                    "rx_packets": sum(&|s| s.rx_packets.get()),
                    "tx_packets": sum(&|s| s.tx_packets.get()),
                    "drops": sum(&|s| s.drops_total()),
                })
            })
            .collect();
        json!({ "ports": ports })
    }

    pub fn plugins_json(&self) -> serde_json::Value {
        let table = self.plugin_metrics.table.lock().unwrap_or_else(|e| e.into_inner());
        let plugins: Vec<_> = table
            .iter()
            .map(|(port, name, w, s)| {
                json!({"port": port, "plugin": name, "worker": w, "batches": s.batches.get(), "packets": s.packets.get(),
                       "faults": s.faults_total(), "quarantined": s.quarantined.get() == 1})
            })
            .collect();
        json!({ "plugins": plugins })
    }

    /// Re-reads the config file. Only changes that can be applied at a batch boundary are
    /// accepted; anything else is refused and the running config stays as it is.
    pub fn reload(&mut self) -> Result<String> {
        let new = Config::load(&self.path).context("reload refused, the running config is unchanged")?;
        let shape = |c: &Config| {
            let ports: Vec<_> =
                c.ports.iter().map(|p| format!("{:?}", (&p.name.value, p.driver.value, p.mtu))).collect();
            (ports, c.workers.len(), c.pool.frames.value, c.pool.frame_size.value, c.listen_addr())
        };
        if shape(&new) != shape(&self.config) {
            bail!("reload refused: ports, workers, pool or metrics address changed; restart the daemon to apply those");
        }
        // Plugins: compile the new chains here (off the data path); each worker swaps them in
        // between two batches, so no frame is lost. A compile or init error leaves everything
        // as it was.
        let dp = &self.dataplane;
        let names: Vec<String> = dp.ports.iter().map(|p| p.name.clone()).collect();
        let engine = crate::plugins::engine()?;
        let chains = crate::plugins::compile(&engine, &new, &self.path, names.len())
            .context("reload refused, the running config is unchanged")?;
        let mut table = Vec::new();
        let mut per_worker = Vec::new();
        for w in 0..dp.workers.len() {
            per_worker.push(
                chains.instantiate(w, &names, &mut table).context("reload refused, the running config is unchanged")?,
            );
        }
        for (w, stages) in per_worker.into_iter().enumerate() {
            for (p, stage) in stages.into_iter().enumerate() {
                dp.workers[w].control.send(crate::dataplane::Command::SetIngress(p as wasmswitch_core::PortId, stage));
            }
        }
        let n = table.len() / dp.workers.len().max(1);
        *self.plugin_metrics.table.lock().unwrap_or_else(|e| e.into_inner()) = table;
        self.config = new;
        Ok(format!("configuration re-read; {n} plugin(s) (re)loaded and swapped in at the next batch"))
    }
}

/// Runs the daemon until SIGINT or SIGTERM, then drains the workers and checks every frame
/// came back. SIGHUP reloads.
pub fn run(path: &Path) -> Result<()> {
    let switch = Switch::start(path)?;
    let addr = switch.config.listen_addr();
    let metrics = Arc::new(Metrics::new(switch.collector()));
    log::info!(
        "wasmswitch running: {} port(s), {} worker(s), {} frames of {} bytes",
        switch.config.ports.len(),
        switch.config.workers.len(),
        switch.config.pool.frames.value,
        switch.config.pool.frame_size.value
    );
    let switch = Arc::new(Mutex::new(switch));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the control runtime")?;
    let state = ApiState { metrics, switch: switch.clone() };
    let control = switch.clone();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (metrics.listen)"))?;
        log::info!("metrics and control API on http://{addr}/metrics");
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let mut hup = signal(SignalKind::hangup())?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, router(state))
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await
        });
        loop {
            tokio::select! {
                _ = term.recv() => { log::info!("SIGTERM: draining"); break; }
                _ = int.recv() => { log::info!("SIGINT: draining"); break; }
                _ = hup.recv() => {
                    match control.lock().unwrap_or_else(|e| e.into_inner()).reload() {
                        Ok(s) => log::info!("SIGHUP: {s}"),
                        Err(e) => log::error!("SIGHUP: {e:#}"),
                    }
                }
            }
        }
        let _ = stop_tx.send(());
        let _ = server.await;
        anyhow::Ok(())
    })?;
    let mut sw = switch.lock().unwrap_or_else(|e| e.into_inner());
    sw.dataplane.stop()?;
    log::info!("stopped cleanly: all {} frames are back in the pool", sw.dataplane.pool.total_frames());
    Ok(())
}
