//! Shared test helpers: building the example plugins, hand-made hostile components, batches.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use wasmswitch_core::batch::Desc;
use wasmswitch_core::verdict::{BatchView, Verdict, VerdictStage};
use wasmswitch_core::wire;
use wasmswitch_core::{PortId, Umem};
use wasmswitch_plugin_host::{EngineOptions, PluginEngine};

pub use wasmswitch_testkit::repo;

/// Builds every example plugin once per test binary with `plugins/build.sh` (which installs
/// the Debian wasm toolchain on a fresh root machine) and returns the output folder.
pub fn examples() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugins");
        let status = std::process::Command::new("bash")
            .arg(repo().join("plugins/build.sh"))
            .env("WASMSWITCH_PLUGIN_OUT", &out)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run plugins/build.sh");
        assert!(status.success(), "plugins/build.sh failed");
        out
    })
}

/// Builds test plugins of `plugins/testdata` (never built by default) once per test binary,
/// into the same folder as [`examples`].
pub fn test_plugin(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let out = examples();
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|b| b == name) {
        let status = std::process::Command::new("bash")
            .arg(repo().join("plugins/build.sh"))
            .arg(name)
            .env("WASMSWITCH_PLUGIN_OUT", out)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run plugins/build.sh");
        assert!(status.success(), "plugins/build.sh {name} failed");
        built.push(name.to_owned());
    }
    out.join(format!("{name}.wasm"))
}

/// The test binary's logger: env_logger (as `RUST_LOG` says) behind a recorder of every
/// record of the switch's own targets, debug level included, for the tests of what a plugin's
/// faults log ([`logged`]).
struct Capture {
    inner: env_logger::Logger,
    records: std::sync::Mutex<Vec<(log::Level, String)>>,
}

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.target().starts_with("wasmswitch") || self.inner.enabled(m)
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.target().starts_with("wasmswitch") {
            self.records.lock().unwrap_or_else(|e| e.into_inner()).push((r.level(), r.args().to_string()));
        }
        if self.inner.matches(r) {
            self.inner.log(r);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();

/// Every record logged so far by the switch's targets, with its level. Tests run in parallel:
/// filter by a plugin name of your own.
pub fn logged() -> Vec<(log::Level, String)> {
    init_logger();
    CAPTURE.get().map(|c| c.records.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap_or_default()
}

fn init_logger() {
    CAPTURE.get_or_init(|| {
        let inner = env_logger::Builder::from_env(env_logger::Env::default()).is_test(true).build();
        let c: &'static Capture = Box::leak(Box::new(Capture { inner, records: Default::default() }));
        if log::set_logger(c).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
        c
    });
}

pub fn engine() -> Arc<PluginEngine> {
    static E: OnceLock<Arc<PluginEngine>> = OnceLock::new();
    E.get_or_init(|| {
        init_logger();
        PluginEngine::new(EngineOptions::default()).unwrap()
    })
    .clone()
}

pub use wasmswitch_testkit::plugin::{component, component_with_strings};

/// A core module of the plugin world whose `process` body is `body` (params $p $len; must
/// leave an i32 return-area pointer). The helper `$ok` returns all-pass verdicts.
pub fn guest(body: &str) -> String {
    format!(
        r#"(module
  (memory (export "memory") 1)
  (data (i32.const 64) "nope: bad config")
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "init") (param $p i32) (param $len i32) (result i32)
    ;; config "refuse" -> Err("nope: bad config")
    (if (i32.and (i32.eq (local.get $len) (i32.const 6)) (i32.eq (i32.load8_u (local.get $p)) (i32.const 114)))
      (then
        (i32.store8 (i32.const 16) (i32.const 1))
        (i32.store (i32.const 20) (i32.const 64))
        (i32.store (i32.const 24) (i32.const 16))
        (return (i32.const 16))))
    (i32.store8 (i32.const 16) (i32.const 0))
    (i32.const 16))
  (func $ok (param $p i32) (result i32)
    (local $n i32)
    (local.set $n (i32.mul (i32.load16_u offset=2 (local.get $p)) (i32.const 4)))
    (memory.fill (i32.const 32768) (i32.const 0) (local.get $n))
    (i32.store (i32.const 32) (i32.const 32768))
    (i32.store (i32.const 36) (local.get $n))
    (i32.const 32))
  (func (export "process") (param $p i32) (param $len i32) (result i32)
    {body})
)"#
    )
}

pub fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    // Tests running at once write the same names (`counting-alpha.wasm`): write aside and
    // rename, so a reader never sees a file another test has just truncated.
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

/// Frames in a UMEM with parsed metadata: what a worker hands a verdict stage.
pub struct TestBatch {
    pub umem: Umem,
    pub descs: Vec<Desc>,
    pub meta: Vec<wire::PacketMeta>,
    pub in_port: u16,
}

impl TestBatch {
    pub fn new(frames: &[Vec<u8>], in_port: u16) -> Self {
        let umem = Umem::new(256, 2048).unwrap();
        let mut descs = Vec::new();
        let mut meta = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let addr = i as u64 * 2048 + 256;
            // SAFETY: the test owns the whole UMEM; frame i lives alone in frame slot i.
            unsafe { umem.bytes_mut(addr, f.len()) }.copy_from_slice(f);
            descs.push(Desc { addr, len: f.len() as u32, options: 0 });
            meta.push(wire::parse(f, 1522).expect("test frames parse"));
        }
        Self { umem, descs, meta, in_port }
    }

    pub fn run(&self, stage: &mut dyn VerdictStage) -> Vec<Verdict> {
        let view = BatchView {
            in_port: PortId(self.in_port),
            queue: 0,
            umem: &self.umem,
            descs: &self.descs,
            meta: &self.meta,
        };
        let mut v = vec![Verdict::Pass; self.descs.len()];
        stage.run(&view, &mut v);
        v
    }
}
