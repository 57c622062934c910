//! The wasmtime engine, the host functions it links, the compile cache and `compile`: a plugin
//! file in, a checked [`Component`] out (control thread, off the data path); `compile`, which
//! makes the [`crate::PluginFactory`] of it, lives with the factory in `stage.rs`.

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmswitch_plugin_sdk::abi;
use wasmtime::component::{Component, Linker, WasmStr};
use wasmtime::{Config, Engine, StoreContextMut};

use crate::cache::{CacheKey, CacheStats, CompileCache, Discard};
use crate::deadline::EPOCH_TICK;
use crate::sandbox::{host_log, HostState};
use crate::spec::{err, wt, ErrorKind, PluginError, PluginSpec};

/// The first eight bytes of a core module: magic, then version 1 (a component's are
/// magic, then version 0xd and layer 1).
const CORE_MODULE_HEADER: &[u8] = b"\0asm\x01\0\0\0";

/// Engine-wide settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Where compiled plugins are cached (`<key>.cwasm`, see [`verified_payload`]) and the key
    /// their entries are authenticated with; `None` disables the cache. Loading an entry runs
    /// the native code in it: the key must be one only the daemon holds, and the directory
    /// the daemon user's own (see [`crate::check_dir`] and [`CacheKey::load_or_create`]).
    pub cache: Option<CompileCache>,
    /// Where cache hits, compiles and discarded entries are counted (the daemon passes one
    /// set for the whole process: it makes an engine per start and reload).
    pub cache_stats: Arc<CacheStats>,
    /// Epoch tick: deadline granularity. A deadline first fires after `deadline` rounded up to
    /// whole ticks, plus up to one more tick (see [`deadline_as_enforced`]).
    pub epoch_tick: Duration,
    /// Whether compiled plugin code checks the epoch, which is what enforces the CPU-time
    /// deadline. Always on in the daemon; off only for `wasmswitch bench`'s
    /// `l2+plugin-no-deadline`, which measures what the checks cost (a plugin that spins then
    /// never returns).
    pub deadline_checks: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self { cache: None, cache_stats: Arc::default(), epoch_tick: EPOCH_TICK, deadline_checks: true }
    }
}

/// The wasmtime engine, host functions and compile cache; one per process.
pub struct PluginEngine {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) opts: EngineOptions,
    pub(crate) stop: Arc<AtomicBool>,
    /// Epoch ticks so far, counted beside the engine's own epoch (which wasmtime does not
    /// let the host read): a stage reads it around each call to see one that ran past its
    /// deadline where no epoch check could stop it (see [`crate::stage::CPU_WATCH_CALLS`]).
    pub(crate) ticks: Arc<AtomicU64>,
    /// Entries this engine discarded (its `cache_stats` may be shared with other engines).
    cache_discarded: AtomicU64,
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl PluginEngine {
    /// Builds the engine: Cranelift, component model, no async/concurrency support, epoch
    /// interruption (a ticker thread advances the epoch every `epoch_tick`).
    pub fn new(opts: EngineOptions) -> Result<Arc<Self>, String> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.concurrency_support(false);
        config.epoch_interruption(opts.deadline_checks);
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        // `perf` names plugin functions when this is set (wasmtime writes /tmp/perf-PID.map).
        if std::env::var_os("WASMSWITCH_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(|e| format!("wasmtime engine: {}", wt(&e)))?;
        let mut linker = Linker::new(&engine);
        {
            let mut root = linker.root();
            let mut host = root.instance(abi::HOST_INTERFACE).map_err(|e| wt(&e))?;
            host.func_wrap("log", host_log).map_err(|e| wt(&e))?;
            // The name as a view of the guest's memory: a name of many MiB is not copied out
            // (nor back in an error), only checked; UTF-8 only (`refuse_utf16_strings`).
            host.func_wrap("register-counter", |mut cx: StoreContextMut<'_, HostState>, (name,): (WasmStr,)| {
                let name = name.to_str(&cx)?;
                let id = cx.data().stats.named.register(&name);
                drop(name);
                Ok((id.and_then(|id| cx.data_mut().guest_counter_id(id)),))
            })
            .map_err(|e| wt(&e))?;
            host.func_wrap("counter-add", |cx: StoreContextMut<'_, HostState>, (id, delta): (u32, u64)| {
                cx.data().counter_add(id, delta);
                Ok(())
            })
            .map_err(|e| wt(&e))?;
            host.func_wrap("now-ns", |cx: StoreContextMut<'_, HostState>, (): ()| {
                Ok((cx.data().clock_base.elapsed().as_nanos() as u64,))
            })
            .map_err(|e| wt(&e))?;
        }
        if let Some(c) = &opts.cache {
            std::fs::create_dir_all(&c.dir).map_err(|e| format!("plugin cache {}: {e}", c.dir.display()))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let ticks = Arc::new(AtomicU64::new(0));
        let (weak, stop2, tick, ticks2) = (engine.weak(), stop.clone(), opts.epoch_tick, ticks.clone());
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    match weak.upgrade() {
                        Some(e) => {
                            e.increment_epoch();
                            ticks2.fetch_add(1, Ordering::Relaxed);
                        }
                        None => break,
                    }
                }
            })
            .map_err(|e| format!("epoch thread: {e}"))?;
        Ok(Arc::new(Self { engine, linker, opts, stop, ticks, cache_discarded: AtomicU64::new(0) }))
    }

    /// The wasmtime engine (what a plugin's `Store` is made in).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The cache key of `bytes` under this engine's configuration: SHA-256 over wasmtime's
    /// compatibility hash (its version, the target and every setting that affects the
    /// generated code), a format tag and the component itself.
    fn cache_key(&self, bytes: &[u8]) -> [u8; 32] {
        struct ShaHasher(Sha256);
        impl Hasher for ShaHasher {
            fn finish(&self) -> u64 {
                0
            }
            fn write(&mut self, b: &[u8]) {
                self.0.update(b);
            }
        }
        let mut h = ShaHasher(Sha256::new());
        std::hash::Hash::hash(&self.engine.precompile_compatibility_hash(), &mut h);
        h.0.update(CACHE_MAGIC);
        h.0.update(bytes);
        h.0.finalize().into()
    }

    /// Cache file for the key: `<hex key>.cwasm` in the cache directory.
    pub(crate) fn cache_path(&self, key: &[u8; 32]) -> Option<PathBuf> {
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        Some(self.opts.cache.as_ref()?.dir.join(format!("{hex}.cwasm")))
    }

    /// Cache entries found invalid (forged, written for another component, corrupt,
    /// unreadable, refused by wasmtime), deleted and recompiled since this engine started.
    pub fn cache_discarded(&self) -> u64 {
        self.cache_discarded.load(Ordering::Relaxed)
    }

    /// The counts this engine adds to (see [`EngineOptions::cache_stats`]).
    pub fn cache_stats(&self) -> &Arc<CacheStats> {
        &self.opts.cache_stats
    }

    pub(crate) fn load_component(&self, spec: &PluginSpec, bytes: &[u8]) -> Result<(Component, bool), PluginError> {
        let key = self.cache_key(bytes);
        let cached = self.cache_path(&key);
        let stats = &self.opts.cache_stats;
        if let (Some(p), Some(cache)) = (cached.as_ref().filter(|p| p.symlink_metadata().is_ok()), &self.opts.cache) {
            // Read into memory rather than `deserialize_file`: that one mmaps the file, and a
            // cache entry truncated under a live plugin would then SIGBUS the switch.
            let loaded = read_regular_file(p, MAX_CACHE_ENTRY_BYTES)
                .map_err(|e| (Discard::Unreadable, e.to_string()))
                .and_then(|data| {
                    let payload = verified_payload(&data, &key, &cache.key)?;
                    // SAFETY: `Component::deserialize` runs the native code it is given, so
                    // only our own `Component::serialize` output may reach it. `payload`
                    // passed `verified_payload`: its MAC is one only a holder of the cache key
                    // can make, and the key is read before the daemon drops privileges and
                    // kept in memory, so a process of the daemon's user cannot forge an entry;
                    // and the entry names this component's key (component bytes, wasmtime
                    // version and codegen settings), so another plugin's entry copied over
                    // this one's name is refused too. wasmtime checks its own header and
                    // version.
                    unsafe { Component::deserialize(&self.engine, payload) }.map_err(|e| (Discard::Wasmtime, wt(&e)))
                });
            match loaded {
                Ok(c) => {
                    stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok((c, true));
                }
                Err((why, e)) => {
                    self.cache_discarded.fetch_add(1, Ordering::Relaxed);
                    stats.discard(why);
                    log::warn!("plugin `{}`: discarding cache entry {}: {e}; recompiling", spec.name, p.display());
                    if let Err(e) = std::fs::remove_file(p) {
                        log::warn!("plugin `{}`: cannot delete cache entry {}: {e}", spec.name, p.display());
                    }
                }
            }
        }
        let c = Component::new(&self.engine, bytes).map_err(|e| {
            // wasmparser's own words for a core module ("unknown binary version") do not say
            // what to do: plugins are components only.
            let hint = if bytes.starts_with(CORE_MODULE_HEADER) {
                " (this is a core WebAssembly module: plugins are components of the WIT world in `wit/`; \
                 `wasmswitch plugin build` makes one from a plugin crate, `wasm-tools component new` from a module)"
            } else {
                ""
            };
            err(spec, ErrorKind::Compile, format!("{}: not a valid component: {}{hint}", spec.path.display(), wt(&e)))
        })?;
        stats.compiled.fetch_add(1, Ordering::Relaxed);
        if let (Some(p), Some(cache)) = (cached, &self.opts.cache) {
            match c.serialize() {
                Ok(payload) => {
                    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                    let mut data = Vec::with_capacity(CACHE_HEADER_BYTES + payload.len());
                    data.extend_from_slice(CACHE_MAGIC);
                    data.extend_from_slice(&key);
                    data.extend_from_slice(&cache.key.mac(&[CACHE_MAGIC, &key, &payload]));
                    data.extend_from_slice(&payload);
                    // A new file (no symlink followed, nothing left there replaced), then renamed.
                    let write = || {
                        use std::io::Write;
                        use std::os::unix::fs::OpenOptionsExt;
                        let _ = std::fs::remove_file(&tmp);
                        let mut f = std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(0o600)
                            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                            .open(&tmp)?;
                        f.write_all(&data)?;
                        std::fs::rename(&tmp, &p)
                    };
                    if write().is_err() {
                        let _ = std::fs::remove_file(&tmp);
                        log::warn!("plugin `{}`: could not write cache entry {}", spec.name, p.display());
                    }
                }
                Err(e) => log::warn!("plugin `{}`: serialize: {}", spec.name, wt(&e)),
            }
        }
        Ok((c, false))
    }
}

/// Tags a cache entry of this format; also hashed into the key, so entries of an older
/// format get other names and are never read.
const CACHE_MAGIC: &[u8; 16] = b"wasmswitch-cwsm3";
/// Magic, the key the entry was written for, HMAC-SHA256 of magic, key and payload under the
/// cache key.
const CACHE_HEADER_BYTES: usize = 16 + 32 + 32;
/// Largest cache entry read (compiled code is a few times the component's size).
const MAX_CACHE_ENTRY_BYTES: u64 = 4 * MAX_PLUGIN_BYTES;

/// The serialized component in a cache entry, if the entry is of this format, was written for
/// `key` and carries the MAC of its magic, key and payload under `mac_key`. The file name
/// alone proves nothing (an entry copied over another's name would otherwise run the other
/// plugin's code), nor does a digest anyone can compute: only the MAC says this daemon
/// wrote it.
fn verified_payload<'a>(data: &'a [u8], key: &[u8; 32], mac_key: &CacheKey) -> Result<&'a [u8], (Discard, String)> {
    if data.len() < CACHE_HEADER_BYTES || &data[..16] != CACHE_MAGIC {
        return Err((Discard::Format, "not a cache entry of this version".into()));
    }
    let (written_for, mac, payload) = (&data[16..48], &data[48..80], &data[CACHE_HEADER_BYTES..]);
    if written_for != key {
        return Err((Discard::OtherComponent, "it was written for another component or engine configuration".into()));
    }
    if !crate::cache::same_mac(mac, &mac_key.mac(&[CACHE_MAGIC, key, payload])) {
        return Err((
            Discard::BadMac,
            "its MAC does not match: not written under this daemon's cache key (forged, damaged, or from before the key changed)".into(),
        ));
    }
    Ok(payload)
}

/// Largest plugin file accepted (a component is typically tens to hundreds of KiB).
pub const MAX_PLUGIN_BYTES: u64 = 64 << 20;

/// Reads `path` if it is a regular file of at most `max` bytes. The file is opened with
/// O_NONBLOCK and checked with fstat before any read, so a FIFO, socket or device put where a
/// file was expected is refused at once instead of blocking the reader (a FIFO with no writer
/// would block a plain open forever).
pub fn read_regular_file(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("file is {} bytes, more than the limit of {max}", meta.len()),
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    // take(max + 1): a file that grows while it is read is still caught by the limit.
    file.take(max + 1).read_to_end(&mut data)?;
    if data.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("file grew past the limit of {max} bytes"),
        ));
    }
    Ok(data)
}

/// Refuses a component that passes strings as UTF-16 (or compact UTF-16) across its boundary.
/// The host reads a guest's string (`log`, `register-counter`) before checking its length: a
/// UTF-8 string is read in place, but a UTF-16 one is transcoded whole into host memory, so a
/// guest could make the host allocate twice its own memory per call. Rust, C (`wit-bindgen`)
/// and the usual componentize tools pass UTF-8.
pub(crate) fn refuse_utf16_strings(bytes: &[u8]) -> Result<(), String> {
    use wasmparser::{CanonicalFunction, CanonicalOption, Payload};
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        // What does not parse is left to the compiler, whose message names it.
        let Ok(Payload::ComponentCanonicalSection(section)) = payload else { continue };
        for f in section.into_iter().flatten() {
            let options = match &f {
                CanonicalFunction::Lift { options, .. } | CanonicalFunction::Lower { options, .. } => options,
                _ => continue,
            };
            if options.iter().any(|o| matches!(o, CanonicalOption::UTF16 | CanonicalOption::CompactUTF16)) {
                return Err("refused: it passes strings as UTF-16; plugins pass them as UTF-8 (the host reads a UTF-16 string whole before it can check its length)".into());
            }
        }
    }
    Ok(())
}
