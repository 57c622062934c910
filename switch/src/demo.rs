//! `wasmswitch demo`: the switch's main job on a built-in lab.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::config::Config;
use crate::dataplane::Dataplane;
use crate::lab::{can_build, Lab};

/// The built-in sim topology (the same file as `configs/sim.yaml`).
pub const SIM_YAML: &str = include_str!("../../configs/sim.yaml");

/// Per-port packet totals (rx, tx, drops) summed over workers.
fn totals(dp: &Dataplane) -> Vec<(u64, u64, u64)> {
    (0..dp.ports.len())
        .map(|p| {
            dp.workers.iter().fold((0, 0, 0), |(r, t, d), w| {
                let s = &w.stats.ports[p];
                (r + s.rx_packets.get(), t + s.tx_packets.get(), d + s.drops_total())
            })
        })
        .collect()
}

/// Prints live per-port rates once a second until `seconds` pass or Ctrl-C.
pub fn print_rates(dp: &Dataplane, seconds: Option<u64>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let start = Instant::now();
    let mut last = totals(dp);
    let mut last_t = Instant::now();
    println!("{:<10} {:>12} {:>12} {:>10} {:>14}", "port", "rx pps", "tx pps", "drops/s", "fdb entries");
    rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => { println!("interrupted"); break; }
                _ = tick.tick() => {}
            }
            let now = totals(dp);
            let dt = last_t.elapsed().as_secs_f64();
            last_t = Instant::now();
            for (p, info) in dp.ports.snapshot() {
                let p = p as usize;
                let (r0, t0, d0) = last[p];
                let (r1, t1, d1) = now[p];
                println!(
                    "{:<10} {:>12.0} {:>12.0} {:>10.0} {:>14}",
                    info.name,
                    (r1 - r0) as f64 / dt,
                    (t1 - t0) as f64 / dt,
                    (d1 - d0) as f64 / dt,
                    if p == 0 { dp.fdb.get().len().to_string() } else { String::new() }
                );
            }
            println!();
            last = now;
            if seconds.is_some_and(|s| start.elapsed() >= Duration::from_secs(s)) {
                break;
            }
        }
    });
    Ok(())
}

/// Runs the sim lab.
pub fn run_sim(seconds: Option<u64>) -> Result<()> {
    let cfg = Config::parse(SIM_YAML, Path::new("configs/sim.yaml")).context("the built-in demo config is broken")?;
    println!("wasmswitch demo (sim driver): {} ports with generated traffic, one worker", cfg.ports.len());
    let mut dp = Dataplane::start(&cfg)?;
    print_rates(&dp, seconds)?;
    dp.stop()?;
    println!("stopped: all {} frames are back in the pool", dp.pool.total_frames());
    Ok(())
}

/// The YAML of a switch with one AF_XDP port per lab host.
pub fn lab_yaml(lab: &Lab, listen: &str, idle: &str) -> String {
    let mut y = format!("metrics:\n  listen: {listen}\nworkers:\n  - idle: {idle}\nports:\n");
    for h in &lab.hosts {
        y += &format!("  - name: {}\n    driver: afxdp\n    afxdp:\n      interface: {}\n", h.name, h.switch_if);
    }
    y
}

/// Waits for an `iperf3 -J` client and summarises its result in one line.
fn tcp_summary(client: std::process::Child) -> String {
    let out = match client.wait_with_output() {
        Ok(o) => o,
        Err(e) => return format!("TCP: iperf3 did not finish: {e}"),
    };
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if let Some(e) = j.get("error") {
        return format!("TCP: iperf3 failed: {e}");
    }
    let s = &j["end"]["sum_sent"];
    match (s["bits_per_second"].as_f64(), s["retransmits"].as_u64()) {
        (Some(bps), Some(r)) => format!("TCP: {:.2} Gbit/s, {r} retransmitted segments", bps / 1e9),
        _ => "TCP: iperf3 gave no result (interrupted?)".to_string(),
    }
}

/// `wasmswitch demo`: a lab of three hosts switched through AF_XDP; the sim lab without root.
pub fn run(seconds: Option<u64>, sim: bool) -> Result<()> {
    if sim {
        return run_sim(seconds);
    }
    if let Err(why) = can_build() {
        println!("The AF_XDP lab needs root ({why}); running the sim demo instead.");
        return run_sim(seconds);
    }
    let prefix = format!("wsd{}", std::process::id() % 100_000);
    let lab = Lab::create(&prefix, 3, 1, 1)?;
    println!("lab: 3 hosts on veth pairs into the switch:");
    for h in &lab.hosts {
        println!("  {:<3} {} ({}) <-> switch port on {}", h.name, h.ip, h.mac, h.switch_if);
    }
    let yaml = lab_yaml(&lab, "127.0.0.1:9187", "sleep");
    let cfg = Config::parse(&yaml, Path::new("<demo lab>"))?;
    let mut dp = Dataplane::start(&cfg)?;
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        let (ha, hb) = (&lab.hosts[a], &lab.hosts[b]);
        let ok = ha.ping(&hb.ip, 3)?;
        println!("ping {} -> {} ({}): {}", ha.name, hb.name, hb.ip, if ok { "ok" } else { "FAILED" });
    }
    // A real TCP transfer h1 -> h2 (the hosts' veths keep the kernel's default offloads, so
    // the switch completes the checksums their senders left to offload), shown in the rates.
    let (h1, h2) = (&lab.hosts[0], &lab.hosts[1]);
    let mut server = h2.cmd(&["iperf3", "-s", "-1"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok();
    std::thread::sleep(Duration::from_millis(300));
    let tcp_secs = seconds.unwrap_or(5).clamp(1, 5).to_string();
    let client = match server {
        Some(_) => h1
            .cmd(&["iperf3", "-J", "-c", &h2.ip, "-t", &tcp_secs])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok(),
        None => {
            println!("iperf3 is not installed (scripts/setup.sh installs it): no TCP transfer");
            None
        }
    };
    if client.is_some() {
        println!(
            "TCP: iperf3 {} -> {} for {tcp_secs} s (default offloads), while every host pings the others",
            h1.name, h2.name
        );
    }
    // Background traffic so the rates show something: every host pings the others.
    let mut pingers = Vec::new();
    for h in &lab.hosts {
        for o in &lab.hosts {
            if o.ip != h.ip {
                pingers.push(h.cmd(&["ping", "-q", "-i", "0.01", &o.ip]).stdout(Stdio::null()).spawn()?);
            }
        }
    }
    let shown = print_rates(&dp, seconds);
    for mut p in pingers {
        let _ = p.kill();
        let _ = p.wait();
    }
    if let Some(c) = client {
        println!("{}", tcp_summary(c));
    }
    if let Some(s) = server.as_mut() {
        let _ = s.kill();
        let _ = s.wait();
    }
    let completed: u64 = dp.workers.iter().flat_map(|w| &w.stats.ports).map(|p| p.checksums_completed.get()).sum();
    println!("checksums completed by the switch (left to offload by the senders): {completed}");
    shown?;
    dp.stop()?;
    drop(dp);
    drop(lab);
    println!("stopped: all {} frames back in the pool, XDP programs detached, lab removed", cfg.pool.frames.value);
    Ok(())
}
