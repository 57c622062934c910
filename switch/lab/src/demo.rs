//! `wasmswitch demo`: the switch's main job on a built-in lab.

use std::io::IsTerminal;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use wasmswitch_core::stats::DropReason;

use crate::lab::{can_build, Lab};
use wasmswitch_daemon::config::Config;
use wasmswitch_daemon::daemon::Switch;
use wasmswitch_daemon::dataplane::Dataplane;

/// The built-in sim topology (the same file as `configs/sim.yaml`).
pub const SIM_YAML: &str = include_str!("../../../configs/sim.yaml");

/// Per-port packet totals (rx, tx, drops, policy drops) summed over workers, by port id.
fn totals(dp: &Dataplane) -> Vec<(u64, u64, u64, u64)> {
    (0..dp.ports.len())
        .map(|p| {
            dp.workers.iter().fold((0, 0, 0, 0), |(r, t, d, pd), w| {
                let s = &w.stats.ports[p];
                (
                    r + s.rx_packets.get(),
                    t + s.tx_packets.get(),
                    d + s.drops_total(),
                    pd + s.drops[DropReason::Policy as usize].get(),
                )
            })
        })
        .collect()
}

/// Prints live per-port rates once a second until `seconds` pass or Ctrl-C (true when
/// interrupted), then `extra()`'s lines (e.g. plugin verdicts). On a terminal the block redraws
/// in place; piped, each second's block follows the last.
pub fn print_rates(dp: &Dataplane, seconds: Option<u64>, extra: &dyn Fn() -> Vec<String>) -> Result<bool> {
    let tty = std::io::stdout().is_terminal();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let start = Instant::now();
    let mut last = totals(dp);
    let mut last_t = Instant::now();
    let mut drawn = 0;
    let interrupted = rt.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => { println!("interrupted"); return true; }
                _ = tick.tick() => {}
            }
            let now = totals(dp);
            let dt = last_t.elapsed().as_secs_f64();
            last_t = Instant::now();
            let mut lines = vec![format!(
                "{:<10} {:>10} {:>10} {:>9} {:>13} {:>12}",
                "port", "rx pps", "tx pps", "drops/s", "policy drops", "fdb entries"
            )];
            for (p, info) in dp.ports.snapshot() {
                let p = p.index();
                let (r0, t0, d0, _) = last.get(p).copied().unwrap_or_default();
                let (r1, t1, d1, pd) = now[p];
                lines.push(format!(
                    "{:<10} {:>10.0} {:>10.0} {:>9.0} {:>13} {:>12}",
                    info.name,
                    r1.saturating_sub(r0) as f64 / dt,
                    t1.saturating_sub(t0) as f64 / dt,
                    d1.saturating_sub(d0) as f64 / dt,
                    pd,
                    if p == 0 { dp.fdb.get().len().to_string() } else { String::new() }
                ));
            }
            lines.extend(extra());
            if tty && drawn > 0 {
                // Back to the top of the last block, which is cleared and redrawn.
                print!("\x1b[{drawn}A\x1b[J");
            }
            for l in &lines {
                println!("{l}");
            }
            if !tty {
                println!();
            }
            drawn = lines.len();
            last = now;
            if seconds.is_some_and(|s| start.elapsed() >= Duration::from_secs(s)) {
                return false;
            }
        }
    });
    Ok(interrupted)
}

/// Runs the sim lab.
pub fn run_sim(seconds: Option<u64>) -> Result<()> {
    let cfg = Config::parse(SIM_YAML, Path::new("configs/sim.yaml")).context("the built-in demo config is broken")?;
    println!("wasmswitch demo (sim driver): {} ports with generated traffic, one worker", cfg.ports.len());
    let mut dp = Dataplane::start(&cfg)?;
    print_rates(&dp, seconds, &Vec::new)?;
    dp.stop()?;
    println!("stopped: all {} frames are back in the pool", dp.total_frames());
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
        if e.as_str().is_some_and(|e| e.starts_with("interrupt")) {
            return "TCP: stopped by Ctrl-C".to_string();
        }
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
    let acl = Path::new("plugins/out/acl.wasm");
    let Ok(acl) = acl.canonicalize() else {
        println!("{} is missing (scripts/demo.sh builds it: plugins/build.sh acl); the demo needs it", acl.display());
        anyhow::bail!("no acl plugin to demonstrate");
    };
    // The config lives in a scratch folder so that the demo can rewrite it and reload.
    let dir = std::env::temp_dir().join(format!("wasmswitch-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("switch.yaml");
    let write = |rules: &str| -> Result<()> {
        let mut yaml = lab_yaml(&lab, "127.0.0.1:9187", "sleep");
        let h2 = yaml.find("  - name: h2").context("the lab has h2")?;
        let mut plugin = format!(
            "    plugins:\n      - name: acl\n        path: {}\n        on_error: drop\n        config: |\n",
            acl.display()
        );
        for r in rules.lines() {
            plugin += &format!("          {r}\n");
        }
        yaml.insert_str(h2, &plugin);
        std::fs::write(&file, yaml)?;
        Ok(())
    };
    let deny = "default allow\ndeny proto=tcp dport=5201";
    write(deny)?;
    let sw = Switch::start(&file)?;
    let cleanup = || {
        let _ = std::fs::remove_dir_all(&dir);
    };
    println!("\nthe acl plugin (WebAssembly) decides on h1's ingress:");
    for r in deny.lines() {
        println!("    {r}");
    }
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        let (ha, hb) = (&lab.hosts[a], &lab.hosts[b]);
        let ok = ha.ping(&hb.ip, 3)?;
        println!("ping {} -> {} ({}): {}", ha.name, hb.name, hb.ip, if ok { "ok" } else { "FAILED" });
    }
    let (h1, h2) = (&lab.hosts[0], &lab.hosts[1]);
    let Ok(mut server) = h2.cmd(&["iperf3", "-s"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn() else {
        cleanup();
        anyhow::bail!("iperf3 is not installed (scripts/setup.sh installs it)");
    };
    std::thread::sleep(Duration::from_millis(300));
    let policy = |sw: &Switch| -> u64 {
        sw.dataplane.workers.iter().map(|w| w.stats.ports[0].drops[DropReason::Policy as usize].get()).sum()
    };
    let tcp = |secs: &str| {
        h1.cmd(&["iperf3", "-J", "--connect-timeout", "2000", "-c", &h2.ip, "-t", secs])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
    };
    let before = policy(&sw);
    let denied = tcp("2")?;
    println!("TCP {} -> {}:5201 (iperf3): {}", h1.name, h2.ip, tcp_summary(denied).trim_start_matches("TCP: "));
    println!("  the plugin dropped {} packets of it (SYNs) as policy", policy(&sw) - before);
    // Every host pings the others throughout; h1's pings to h2 are counted across the reload.
    let mut pingers = Vec::new();
    for h in &lab.hosts {
        for o in &lab.hosts {
            if o.ip != h.ip {
                pingers.push(h.cmd(&["ping", "-q", "-i", "0.01", &o.ip]).stdout(Stdio::piped()).spawn()?);
            }
        }
    }
    let verdicts = || -> Vec<String> {
        let running = sw.plugin_metrics.get();
        let (pass, drop): (u64, u64) = running
            .plugins
            .iter()
            .fold((0, 0), |(p, d), r| (p + r.stats.verdict_pass.get(), d + r.stats.verdict_drop.get()));
        vec![format!("acl verdicts on h1: {pass} pass, {drop} drop")]
    };
    println!("\nlive (h1 pings everyone; the acl verdicts count up):");
    let mut interrupted = print_rates(&sw.dataplane, Some(3), &verdicts)?;
    let drops_except_policy = |sw: &Switch| -> u64 { totals(&sw.dataplane).iter().map(|&(_, _, d, pd)| d - pd).sum() };
    let lost_before = drops_except_policy(&sw);
    if !interrupted {
        // Hot reload: the rule goes, the plugin stays and decides on the next batch.
        let allow = "default allow\ndeny proto=tcp dport=5999";
        write(allow)?;
        println!("\nhot reload: deny proto=tcp dport=5201 -> deny proto=tcp dport=5999");
        match sw.reload() {
            Ok(r) => println!("  {r}"),
            Err(e) => println!("  {e}"),
        }
        let tcp_secs = seconds.unwrap_or(5).clamp(1, 5).to_string();
        let allowed = tcp(&tcp_secs)?;
        println!("TCP {} -> {}:5201 for {tcp_secs} s, now allowed:", h1.name, h2.ip);
        interrupted = print_rates(&sw.dataplane, Some(tcp_secs.parse().unwrap_or(5)), &verdicts)?;
        if interrupted {
            // Ctrl-C: the client stops now (SIGINT makes iperf3 report what it had), not at
            // the end of its run.
            // SAFETY: kill on a child we own and have not waited for.
            unsafe { libc::kill(allowed.id() as i32, libc::SIGINT) };
        }
        println!("{}", tcp_summary(allowed));
        if !interrupted && seconds.is_none() {
            println!("\nlive until Ctrl-C:");
            print_rates(&sw.dataplane, None, &verdicts)?;
        }
    }
    let mut summary = String::new();
    for (i, p) in pingers.into_iter().enumerate() {
        // SAFETY: kill on a child we own; SIGINT makes ping print its summary.
        unsafe { libc::kill(p.id() as i32, libc::SIGINT) };
        let out = p.wait_with_output()?;
        if i == 0 {
            summary = String::from_utf8_lossy(&out.stdout)
                .lines()
                .find(|l| l.contains("packet loss"))
                .unwrap_or("")
                .to_string();
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    println!("\nping h1 -> h2 through it all (reload included): {summary}");
    println!("frames dropped for any reason but policy, across the reload: {}", drops_except_policy(&sw) - lost_before);
    let completed: u64 =
        sw.dataplane.workers.iter().flat_map(|w| &w.stats.ports).map(|p| p.checksums_completed.get()).sum();
    println!("checksums completed by the switch (left to offload by the senders): {completed}");
    let frames = sw.dataplane.total_frames();
    let stopped = sw.dataplane.stop_shared();
    drop(sw);
    drop(lab);
    cleanup();
    stopped?;
    println!("stopped: all {frames} frames back in the pool, XDP programs detached, lab removed");
    Ok(())
}
