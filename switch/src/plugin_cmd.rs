//! `wasmswitch plugin new` and `wasmswitch plugin build`: a plugin in its own crate, outside
//! this repository.
//!
//! `new` writes a small working plugin crate (a native test, the example plugins' release
//! profile, a README with the commands). `build` turns any plugin crate into a component and
//! proves it loads: cargo for wasm32 (the toolchain `plugins/build.sh` would pick), the
//! `wasmswitch-componentize` library `build.sh` uses too, then the plugin host's own
//! [`PluginEngine::compile`], so a missing export, a forbidden import or a config that `init`
//! refuses is reported by the build instead of by the switch.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use wasmswitch_core::PortId;
use wasmswitch_plugin_host::{EngineOptions, PluginEngine, PluginSpec};

/// The SDK of the checkout this binary was built from (`--sdk` overrides it): the SDK is not
/// published, so a generated crate points at it by path.
pub const DEFAULT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/sdk");

/// The target every plugin is built for.
pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// The arguments of `wasmswitch plugin new`.
#[derive(clap::Args)]
pub struct NewArgs {
    /// The crate's name (letters, digits, `-`, `_`; starting with a letter).
    pub name: String,
    /// The folder to create the crate in: it goes to DIR/NAME.
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// The plugin SDK (`plugins/sdk` of a wasmswitch checkout) the crate depends on by path
    /// [default: the one of the checkout this binary was built from].
    #[arg(long)]
    pub sdk: Option<PathBuf>,
}

/// The arguments of `wasmswitch plugin build`.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// The plugin crate (the folder of its Cargo.toml).
    pub dir: PathBuf,
    /// Where to write the component [default: DIR/<crate name>.wasm].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The config string the check hands the plugin's `init` (as `config:` in the YAML would).
    #[arg(long, default_value = "")]
    pub config: String,
}

/// `wasmswitch plugin new`: writes the crate and returns its folder.
pub fn new(args: &NewArgs) -> Result<PathBuf> {
    check_name(&args.name)?;
    let sdk_arg = args.sdk.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_SDK));
    // Absolute and clean: the crate may be moved relative to the caller's directory.
    let sdk = std::fs::canonicalize(&sdk_arg).ok().filter(|p| p.join("Cargo.toml").is_file()).with_context(|| {
        format!(
            "no plugin SDK at {}: pass --sdk PATH, the plugins/sdk folder of a wasmswitch checkout",
            sdk_arg.display()
        )
    })?;
    let sdk = sdk.to_str().with_context(|| format!("the SDK path {} is not UTF-8", sdk.display()))?;

    let dir = args.dir.join(&args.name);
    match std::fs::read_dir(&dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!("{} exists and is not empty: choose another name or folder", dir.display());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => bail!("{}: {e}", dir.display()),
    }

    let ty = type_name(&args.name);
    let fill =
        |t: &str| t.replace("{{name}}", &args.name).replace("{{Type}}", &ty).replace("{{sdk}}", &toml_string(sdk));
    let files = [
        ("Cargo.toml", fill(CARGO_TOML)),
        ("src/lib.rs", fill(LIB_RS)),
        ("README.md", fill(README_MD)),
        (".gitignore", GITIGNORE.to_string()),
    ];
    std::fs::create_dir_all(dir.join("src")).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("created plugin crate `{}` in {}", args.name, dir.display());
    println!("next: cd {} && cargo test && wasmswitch plugin build . --config dport=5001", dir.display());
    Ok(dir)
}

/// A crate name cargo accepts and that makes a usable library name.
fn check_name(name: &str) -> Result<()> {
    let bad = |why: &str| anyhow::anyhow!("`{name}` is not a valid plugin crate name: {why}");
    let Some(first) = name.chars().next() else { return Err(bad("it is empty")) };
    if !first.is_ascii_alphabetic() {
        return Err(bad("it must start with an ASCII letter"));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(bad(&format!("{c:?} is not allowed (use letters, digits, `-` and `_`)")));
    }
    if name.len() > 64 {
        return Err(bad("it is longer than 64 characters"));
    }
    // Its library name (`-` → `_`) must not be a keyword or shadow a crate every build has.
    let lib = name.replace('-', "_");
    if RESERVED.split(' ').any(|k| k == lib) || lib == "wasmswitch_plugin_sdk" {
        return Err(bad(&format!("`{lib}` is a Rust keyword or a crate name cargo refuses")));
    }
    Ok(())
}

const RESERVED: &str = "Self abstract alloc as async await become box break const continue core crate do dyn else enum extern false final fn for gen if impl in let loop macro match mod move mut override priv proc_macro pub ref return self static std struct super test trait true try type typeof union unsafe unsized use virtual where while yield";

/// `drop-port` → `DropPort`; a name the template imports gets `Policy` appended.
fn type_name(name: &str) -> String {
    let mut out = String::new();
    for part in name.split(['-', '_']).filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(c) = chars.next() {
            out.push(c.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if ["Plugin", "Packet", "Verdict", "Counter", "Harness", "Self"].contains(&out.as_str()) {
        out.push_str("Policy");
    }
    out
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// How plugins are compiled for wasm32 here (the same choice and flags as `plugins/build.sh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toolchain {
    /// rustup with the wasm32-unknown-unknown target installed.
    Rustup,
    /// Debian's rustc-web + rust-web-src + lld-19, std built with -Zbuild-std.
    Debian,
}

const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_STD_SRC: &str = "/usr/lib/rustlib/src/rust/library";
const DEBIAN_WASM_LD: &str = "/usr/lib/llvm-19/bin/wasm-ld";

/// The wasm32 toolchain to build with (from `dir`, whose rustup override counts), or what to
/// install.
pub fn wasm_toolchain(dir: &Path) -> Result<Toolchain, String> {
    let rustup = Command::new("rustup").args(["target", "list", "--installed"]).current_dir(dir).output();
    if let Ok(o) = rustup {
        if o.status.success() && String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == WASM_TARGET) {
            return Ok(Toolchain::Rustup);
        }
    }
    let missing: Vec<&str> =
        [(DEBIAN_RUSTC, "rustc-web"), (DEBIAN_STD_SRC, "rust-web-src"), (DEBIAN_WASM_LD, "lld-19")]
            .into_iter()
            .filter(|(path, _)| !Path::new(path).exists())
            .map(|(_, pkg)| pkg)
            .collect();
    if missing.is_empty() {
        return Ok(Toolchain::Debian);
    }
    Err(format!(
        "no wasm32 toolchain: run `rustup target add {WASM_TARGET}`, or on Debian 12 (whose rustup may have no \
         wasm32 standard library) `apt-get install rustc-web rust-web-src lld-19` as root (missing here: {})",
        missing.join(", ")
    ))
}

/// What `cargo metadata` says about the crate in `dir`.
struct Crate {
    name: String,
    /// The cdylib's name: the core module is `<lib>.wasm`.
    lib: String,
    target_dir: PathBuf,
}

fn cargo() -> Command {
    // `CARGO` is set when run under cargo (a test, `cargo run`): the same cargo builds the plugin.
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn inspect(manifest: &Path) -> Result<Crate> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1", "--manifest-path"])
        .arg(manifest)
        .output()
        .context("running cargo (is it installed?)")?;
    if !out.status.success() {
        bail!("{}: cargo metadata failed:\n{}", manifest.display(), String::from_utf8_lossy(&out.stderr).trim_end());
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading cargo metadata's output")?;
    let canonical = std::fs::canonicalize(manifest).with_context(|| manifest.display().to_string())?;
    // A workspace member's metadata lists the whole workspace: take the package of `manifest`.
    let pkg = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["manifest_path"].as_str().and_then(|m| std::fs::canonicalize(m).ok()).as_ref() == Some(&canonical))
        .with_context(|| {
            format!("{}: no package here (a workspace root?): point at one plugin crate", manifest.display())
        })?;
    let name = pkg["name"].as_str().unwrap_or_default().to_string();
    let lib = pkg["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["crate_types"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib")))
        .and_then(|t| t["name"].as_str())
        .with_context(|| {
            format!(
                "{}: package `{name}` has no cdylib: a plugin needs `[lib] crate-type = [\"cdylib\", \"rlib\"]`",
                manifest.display()
            )
        })?
        .to_string();
    let target_dir =
        PathBuf::from(meta["target_directory"].as_str().context("cargo metadata gave no target_directory")?);
    Ok(Crate { name, lib, target_dir })
}

/// `wasmswitch plugin build`: builds, wraps and checks; returns the component's path.
pub fn build(args: &BuildArgs) -> Result<PathBuf> {
    let manifest = args.dir.join("Cargo.toml");
    if !manifest.is_file() {
        bail!(
            "{}: no Cargo.toml there: `wasmswitch plugin build` takes the folder of a plugin crate (make one with `wasmswitch plugin new NAME`)",
            args.dir.display()
        );
    }
    let krate = inspect(&manifest)?;
    let toolchain = wasm_toolchain(&args.dir).map_err(anyhow::Error::msg)?;

    let how = match toolchain {
        Toolchain::Rustup => "rustup target",
        Toolchain::Debian => "Debian rustc-web, std built from source",
    };
    eprintln!("building {} for {WASM_TARGET} ({how})…", krate.name);
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--lib", "--target", WASM_TARGET, "--manifest-path"])
        .arg(&manifest)
        .args(["-p", &krate.name]);
    if toolchain == Toolchain::Debian {
        cmd.env("RUSTC", DEBIAN_RUSTC)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("RUSTFLAGS", format!("-C linker={DEBIAN_WASM_LD}"))
            .arg("-Zbuild-std=std,panic_abort");
    }
    // cargo's own output goes straight to the terminal, so its errors read as usual.
    let status = cmd.status().context("running cargo")?;
    if !status.success() {
        bail!("cargo build of {} for {WASM_TARGET} failed ({status}); its errors are above", krate.name);
    }
    let core = krate.target_dir.join(WASM_TARGET).join("release").join(format!("{}.wasm", krate.lib));
    let module = std::fs::read(&core).with_context(|| format!("reading the core module {}", core.display()))?;

    eprintln!("componentizing {}…", core.display());
    let world = wasmswitch_componentize::World::embedded()?;
    let component = world.componentize(&module, &core.display().to_string())?;

    let out = args.out.clone().unwrap_or_else(|| args.dir.join(format!("{}.wasm", krate.name)));
    // Written beside the output and renamed once it passed the check: a switch reloading
    // from `out` never sees a half-written or refused component.
    let tmp = out.with_extension(format!("wasm.tmp{}", std::process::id()));
    std::fs::write(&tmp, &component).with_context(|| format!("writing {}", tmp.display()))?;
    eprintln!("checking it with the plugin host…");
    let checked = check(&krate.name, &tmp, &args.config);
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &out).with_context(|| format!("writing {}", out.display()))?;
    println!("{} ({} bytes)", out.display(), component.len());
    Ok(out)
}

/// Loads `path` as the switch would, with `config`: type-checked, instantiated, `init` run,
/// then the smoke run of `wasmswitch check` (the built-in frames, the default limits).
fn check(name: &str, path: &Path, config: &str) -> Result<()> {
    let engine = PluginEngine::new(EngineOptions::default())
        .map_err(|e| anyhow::anyhow!("cannot start the plugin engine: {e}"))?;
    let mut spec = PluginSpec::new(name, path);
    spec.config = config.to_string();
    let f = engine.compile(&spec).map_err(|e| anyhow::anyhow!("the built component does not load: {e}"))?;
    let report = f.smoke(PortId(0)).map_err(|e| anyhow::anyhow!("the built component faults on a test frame: {e}"))?;
    eprintln!("smoke run: {report}; {}", report.timing());
    if let Some(w) = report.near_deadline() {
        eprintln!("warning: {w}");
    }
    Ok(())
}

const CARGO_TOML: &str = r#"[package]
name = "{{name}}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
# cdylib: the Wasm plugin (`wasmswitch plugin build`); rlib: the native tests (`cargo test`).
crate-type = ["cdylib", "rlib"]

[dependencies]
# The plugin SDK is not published: this is the plugins/sdk folder of the wasmswitch checkout
# this crate was made from (`wasmswitch plugin new --sdk PATH` picks another). Change the path
# when that checkout moves.
wasmswitch-plugin-sdk = { path = {{sdk}} }

# Its own workspace, so it builds on its own even inside another cargo workspace.
[workspace]

# The example plugins' settings (wasmswitch's plugins/Cargo.toml): small, fast components.
[profile.release]
opt-level = 3
lto = true
codegen-units = 1
panic = "abort"
debug = false
strip = "debuginfo"

[profile.test]
opt-level = 1
"#;

const LIB_RS: &str = r#"//! `{{name}}`: a wasmswitch plugin. Drops UDP packets to one destination port and counts them.
//!
//! Config (the `config:` text of its entry in the switch's YAML):
//!
//! ```text
//! dport=5001        # the UDP destination port to drop
//! ```
//!
//! Counter: `dropped` (on the switch's /metrics as
//! `wasmswitch_plugin_events_total{plugin="{{name}}",counter="dropped",...}`).

use wasmswitch_plugin_sdk::{config, export_plugin, Counter, Packet, Plugin, Verdict};

/// One value lives in each switch worker's instance of the plugin.
pub struct {{Type}} {
    /// The UDP destination port to drop.
    port: u16,
    dropped: Counter,
}

/// The port of a `dport=N` config (no host calls: tests can call it directly).
pub fn parse_config(cfg: &str) -> Result<u16, String> {
    let mut port = None;
    for (n, line) in config::lines(cfg) {
        for word in line.split_whitespace() {
            match config::kv(word) {
                Some(("dport", v)) => {
                    port = Some(
                        v.parse()
                            .map_err(|_| format!("line {n}: dport must be 0-65535, not {v:?}"))?,
                    );
                }
                _ => return Err(format!("line {n}: expected dport=N, not {word:?}")),
            }
        }
    }
    port.ok_or_else(|| {
        "no dport=N in the config: which UDP destination port should be dropped?".to_string()
    })
}

impl Plugin for {{Type}} {
    fn init(cfg: &str) -> Result<Self, String> {
        Ok({{Type}} {
            port: parse_config(cfg)?,
            dropped: Counter::register("dropped")?,
        })
    }

    fn verdict(&mut self, p: &Packet<'_>) -> Verdict {
        match (p.ip_proto(), p.ports()) {
            (Some(17), Some((_, dport))) if dport == self.port => {
                // Buffered in the guest: the switch gets the batch's count with the verdicts.
                self.dropped.inc();
                Verdict::Drop
            }
            _ => Verdict::Pass,
        }
    }
}

export_plugin!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;
    use wasmswitch_plugin_sdk::harness::{self, Harness};

    #[test]
    fn drops_udp_to_the_port() {
        let mut h = Harness::<{{Type}}>::init("dport=5001").unwrap();
        assert_eq!(
            h.run_one(&harness::udp4([10, 0, 0, 1], [10, 0, 0, 2], 4000, 5001)),
            Verdict::Drop
        );
        assert_eq!(
            h.run_one(&harness::udp4([10, 0, 0, 1], [10, 0, 0, 2], 4000, 5002)),
            Verdict::Pass
        );
        assert_eq!(
            h.run_one(&harness::tcp4([10, 0, 0, 1], [10, 0, 0, 2], 4000, 5001)),
            Verdict::Pass
        );
        assert_eq!(harness::counter("dropped"), 1);
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(Harness::<{{Type}}>::init("").is_err());
        assert!(parse_config("dport=http").unwrap_err().contains("line 1"));
        assert!(parse_config("port=53")
            .unwrap_err()
            .contains("expected dport=N"));
    }
}
"#;

const README_MD: &str = r#"# {{name}}

A wasmswitch plugin: drops UDP packets to the destination port its config
names (`dport=5001`) and counts them in the counter `dropped`. Make it yours in `src/lib.rs`
(the SDK's documentation: `cargo doc --open -p wasmswitch-plugin-sdk`).

**Test** it natively (the SDK's harness batches frames exactly as the switch does):

    cargo test

**Build** the component, checked by loading it with the switch's plugin host and running
`init` with a config:

    wasmswitch plugin build . --config dport=5001     # writes {{name}}.wasm

This needs a wasm32 toolchain: `rustup target add wasm32-unknown-unknown`, or on Debian 12 (whose
rustup may lack a wasm32 standard library) `apt-get install rustc-web rust-web-src lld-19`.

**Load** it: add it to a port in the switch's YAML (`path:` is relative to the config file;
this one sits next to this README), then check the config, which loads every plugin:

```yaml
ports:
  - name: p0
    driver: sim            # or afxdp with an interface
    plugins:
      - name: {{name}}
        path: {{name}}.wasm
        header_bytes: 64   # enough for Ethernet, a VLAN tag, IPv4/IPv6 and the UDP ports
        on_error: pass
        config: |
          dport=5001
  - name: p1
    driver: sim
```

    wasmswitch check -c switch.yaml
"#;

const GITIGNORE: &str = "/target\n/*.wasm\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "drop-port", "drop_port2", "X"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("1x", "start with"),
            ("-x", "start with"),
            ("a b", "' ' is not allowed"),
            ("a/b", "'/' is not allowed"),
            ("a.b", "'.' is not allowed"),
            ("self", "keyword"),
            ("test", "keyword"),
            ("wasmswitch-plugin-sdk", "refuses"),
        ] {
            let e = check_name(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(check_name(&"a".repeat(65)).is_err());
        assert_eq!(type_name("drop-port"), "DropPort");
        assert_eq!(type_name("a__b"), "AB");
        assert_eq!(type_name("plugin"), "PluginPolicy");
        assert_eq!(toml_string("/a \"b\"\\c"), r#""/a \"b\"\\c""#);
    }
}
