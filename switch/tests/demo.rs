//! The README's first command: `wasmswitch demo` on the AF_XDP lab, with the acl plugin
//! denying a TCP flow that passes after a hot reload. Needs root and plugins/out/acl.wasm
//! (scripts/test.sh builds it); fails under CI=true when it cannot run.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn the_demo_shows_a_plugin_deny_then_allow_after_a_hot_reload() {
    if !require_lab("the_demo_shows_a_plugin_deny_then_allow_after_a_hot_reload") {
        return;
    }
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
