//! `wasmswitch-bench-native` end to end: one plugin through wasmtime and compiled natively.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_wasmswitch-bench-native")
}

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

#[test]
fn bench_with_a_plugin_runs_it_in_wasm_and_natively() {
    let out = Command::new(bin()).args(["--seconds", "0.2", "--scenario", "l2+native"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("scenario `l2+native` needs --plugin FILE"));
    let wasm = repo("plugins/out/acl.wasm");
    if !wasm.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "plugins/out/acl.wasm missing: scripts/test.sh builds it first"
        );
        eprintln!("skipped: build the plugins with plugins/build.sh");
        return;
    }
    // A deny-all ACL: every IP frame the generator makes is dropped by policy, so a scenario
    // that forwarded anything would not have run the plugin.
    let cfg = std::env::temp_dir().join(format!("wasmswitch-bench-acl-{}.txt", std::process::id()));
    std::fs::write(&cfg, "default deny\n").unwrap();
    let args = ["--json", "--seconds", "0.3", "--scenario", "l2+plugin", "--scenario", "l2+native", "--plugin"];
    let out = Command::new(bin()).args(args).arg(&wasm).arg("--plugin-config").arg(&cfg).output().unwrap();
    let _ = std::fs::remove_file(&cfg);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        let packets = l["packets"].as_u64().unwrap();
        assert!(packets > 1000, "{l}");
        assert!(l["tx_packets"].as_u64().unwrap() < packets / 100, "deny-all forwarded traffic: {l}");
        assert!(l["drops"].as_u64().unwrap() > packets * 9 / 10, "{l}");
        assert_eq!(l["frames_leaked"], 0);
    }
}
