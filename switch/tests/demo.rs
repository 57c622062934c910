//! The README's first command: `wasmswitch demo` on the AF_XDP lab, with the acl plugin
//! denying a TCP flow that passes after a hot reload. Needs root and plugins/out/acl.wasm
//! (scripts/test.sh builds it); fails under CI=true when it cannot run.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

/// One demo at a time: each listens on the demo's fixed metrics port.
static ONE_DEMO: Mutex<()> = Mutex::new(());

#[test]
fn the_demo_shows_a_plugin_deny_then_allow_after_a_hot_reload() {
    if !require_lab("the_demo_shows_a_plugin_deny_then_allow_after_a_hot_reload") {
        return;
    }
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    assert!(root.join("plugins/out/acl.wasm").exists(), "plugins/out/acl.wasm missing: scripts/test.sh builds it");
    let out = Command::new(env!("CARGO_BIN_EXE_wasmswitch"))
        .args(["demo", "--seconds", "2"])
        .current_dir(&root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for want in [
        "ping h1 -> h2 (10.77.1.2): ok",
        "TCP h1 -> 10.77.1.2:5201 (iperf3): iperf3 failed",
        "as policy",
        "hot reload: deny proto=tcp dport=5201",
        "applied: plugins of port `h1` reloaded",
        "now allowed",
        "acl verdicts on h1:",
        "frames dropped for any reason but policy, across the reload: 0",
        "stopped: all 32768 frames back in the pool",
    ] {
        assert!(text.contains(want), "`{want}` missing from the demo's output:\n{text}");
    }
    // Piped, the live view prints plain blocks (no cursor movement).
    assert!(!text.contains("\x1b["), "escape sequences in piped output");
    let dropped: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("the plugin dropped "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("a policy-drop count");
    assert!(dropped > 0, "{text}");
    let tcp = text.lines().skip_while(|l| !l.contains("now allowed")).find(|l| l.starts_with("TCP: ")).unwrap_or("");
    assert!(tcp.contains("Gbit/s"), "the allowed TCP flow moved data: {tcp}\n{text}");
}

/// A process as /proc shows it: parent, start time (with the pid, its identity: pids are
/// reused), state, command line and network namespace.
#[derive(Clone, Debug)]
struct Proc {
    pid: u32,
    ppid: u32,
    start: u64,
    state: char,
    cmdline: String,
    netns: Option<std::path::PathBuf>,
}

/// Every process now, by pid.
fn processes() -> HashMap<u32, Proc> {
    let mut all = HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // "pid (comm) state ppid ...": the comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(") ") else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        all.insert(
            pid,
            Proc {
                pid,
                state: f[0].chars().next().unwrap_or('?'),
                ppid: f[1].parse().unwrap_or(0),
                start: f[19].parse().unwrap_or(0),
                cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " ").trim().to_string(),
                netns: std::fs::read_link(format!("/proc/{pid}/ns/net")).ok(),
            },
        );
    }
    all
}

/// The processes descended from `root` (not `root` itself).
fn descendants(all: &HashMap<u32, Proc>, root: u32) -> Vec<Proc> {
    let mut out: Vec<Proc> = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for c in all.values().filter(|c| c.ppid == p) {
            out.push(c.clone());
            frontier.push(c.pid);
        }
    }
    out
}

/// A SIGKILLed demo takes its lab with it: the lab hosts (namespace keepers), the iperf3
/// server and the pings it runs in them die with it, and with them the namespaces and veths.
/// Before, the iperf3 server and the pings (`-i 0.01`, no count) ran on for ever, each keeping
/// its namespace and so its veth pair.
#[test]
fn a_demo_killed_with_sigkill_leaves_no_process_namespace_or_veth() {
    if !require_lab("a_demo_killed_with_sigkill_leaves_no_process_namespace_or_veth") {
        return;
    }
    let _one = ONE_DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    assert!(root.join("plugins/out/acl.wasm").exists(), "plugins/out/acl.wasm missing: scripts/test.sh builds it");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wasmswitch"));
    cmd.arg("demo").current_dir(&root).stdout(Stdio::null()).stderr(Stdio::null());
    die_with_test(&mut cmd);
    let mut demo = cmd.spawn().unwrap();
    let pid = demo.id();
    // The live phase: the iperf3 server and six pings run (after the denied TCP run, ~5 s in).
    let t = Instant::now();
    let kids = loop {
        let kids = descendants(&processes(), pid);
        let pings = kids.iter().filter(|p| p.cmdline.starts_with("ping -q -i 0.01")).count();
        if pings == 6 && kids.iter().any(|p| p.cmdline.starts_with("iperf3 -s")) {
            break kids;
        }
        if let Some(st) = demo.try_wait().unwrap() {
            panic!("the demo ended before its pings ran: {st}");
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no iperf3 server and six pings under the demo: {kids:#?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let ours = std::fs::read_link("/proc/self/ns/net").ok();
    let namespaces: Vec<_> = kids.iter().filter_map(|p| p.netns.clone()).filter(|n| Some(n) != ours.as_ref()).collect();
    assert!(!namespaces.is_empty(), "the lab hosts' namespaces: {kids:#?}");
    let prefix = format!("wsd{}", pid % 100_000);
    let veths: Vec<String> = (1..=3).map(|i| format!("{prefix}s{i}")).collect();
    assert!(veths.iter().all(|v| Path::new("/sys/class/net").join(v).exists()), "the lab's veths {veths:?}");

    signal(&demo, libc::SIGKILL);
    demo.wait().unwrap();
    // Left: one of the demo's processes still running (a zombie is dead, waiting for its
    // reaper), or any process in one of its lab namespaces, and the lab's veths.
    let left = || {
        let all = processes();
        let procs: Vec<Proc> = all
            .values()
            .filter(|p| p.state != 'Z')
            .filter(|p| {
                kids.iter().any(|k| (k.pid, k.start) == (p.pid, p.start))
                    || p.netns.as_ref().is_some_and(|n| namespaces.contains(n))
            })
            .cloned()
            .collect();
        let links: Vec<&String> = veths.iter().filter(|v| Path::new("/sys/class/net").join(v).exists()).collect();
        (procs, links.into_iter().cloned().collect::<Vec<_>>())
    };
    let t = Instant::now();
    let (mut procs, mut links) = left();
    while (!procs.is_empty() || !links.is_empty()) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        (procs, links) = left();
    }
    // Whatever a failure leaves is cleaned up here, after the count.
    for p in &procs {
        // SAFETY: kill on a pid just read from /proc, matched by start time.
        unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
    }
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("wasmswitch-demo-{pid}")));
    assert!(procs.is_empty() && links.is_empty(), "10 s after SIGKILL: processes {procs:#?}, veths {links:?}");
}
