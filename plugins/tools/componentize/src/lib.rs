//! Wraps a plugin's core Wasm module into a component of the `wasmswitch:plugin` world.
//!
//! Embeds the world into a core module built by the SDK (or by clang from `wit-bindgen c`
//! bindings) and encodes the result as a component, validating that the module's imports and
//! exports match the world's canonical-ABI signatures. This is what `wasm-tools component
//! embed` + `wasm-tools component new` do, without needing that CLI installed.
//!
//! The one implementation: the `wasmswitch-componentize` tool (`plugins/build.sh`) and
//! `wasmswitch plugin build` both call [`World::componentize`].
//!
//! A module that imports anything but the world's `host` interface is refused first, naming
//! the imports: the usual one is WASI (`wasi_snapshot_preview1::fd_write` from a `println!` in
//! a wasm32-wasip1 build), which the switch would refuse at load anyway, and which
//! wit-component reports only as "module requires an import interface named ...".

use std::path::Path;

use anyhow::{bail, Context, Result};
use wit_component::{embed_component_metadata, ComponentEncoder, StringEncoding};
use wit_parser::{Resolve, WorldId, WorldItem};

/// `wit/plugin.wit` as this crate was compiled with it (for programs that must not depend on
/// the repository being around at run time).
pub const PLUGIN_WIT: &str = include_str!("../../../../wit/plugin.wit");

/// The parsed `plugin` world.
pub struct World {
    resolve: Resolve,
    world: WorldId,
}

impl World {
    /// The `plugin` world of the WIT package in the directory `wit`.
    pub fn from_dir(wit: &Path) -> Result<World> {
        let mut resolve = Resolve::default();
        let (pkg, _) = resolve.push_dir(wit).with_context(|| format!("parsing WIT in {}", wit.display()))?;
        let world = resolve.select_world(&[pkg], Some("plugin"))?;
        Ok(World { resolve, world })
    }

    /// The `plugin` world of [`PLUGIN_WIT`].
    pub fn embedded() -> Result<World> {
        let mut resolve = Resolve::default();
        let pkg = resolve.push_source("wit/plugin.wit", PLUGIN_WIT).context("parsing the embedded wit/plugin.wit")?;
        let world = resolve.select_world(&[pkg], Some("plugin"))?;
        Ok(World { resolve, world })
    }

    /// The component of the core module `module`; `what` names it in errors (its file).
    pub fn componentize(&self, module: &[u8], what: &str) -> Result<Vec<u8>> {
        self.check_imports(module).with_context(|| format!("{what}: refused"))?;
        let mut module = module.to_vec();
        embed_component_metadata(&mut module, &self.resolve, self.world, StringEncoding::UTF8)
            .with_context(|| format!("{what}: cannot embed the wasmswitch:plugin world"))?;
        ComponentEncoder::default()
            .module(&module)
            .with_context(|| format!("{what}: not a plugin module"))?
            .validate(true)
            .encode()
            .map_err(|e| {
                // The usual cause: a Rust crate that never invoked the SDK's export macro.
                let missing = format!("{e:#}").contains("failed to find export");
                let hint = if missing {
                    " (a Rust plugin exports `init` and `process` with `wasmswitch_plugin_sdk::export_plugin!(YourPlugin);` at crate level; a C plugin defines the functions of the bindings wit-bindgen generated)"
                } else {
                    ""
                };
                e.context(format!("{what}: does not match the wasmswitch:plugin world{hint}"))
            })
    }

    /// Refuses `module` if it imports anything outside the world's imported interfaces,
    /// naming every such import and saying what usually causes it.
    fn check_imports(&self, module: &[u8]) -> Result<()> {
        let allowed: Vec<String> = self.resolve.worlds[self.world]
            .imports
            .iter()
            .filter(|(_, item)| matches!(item, WorldItem::Interface { .. }))
            .map(|(key, _)| self.resolve.name_world_key(key))
            .collect();
        let mut foreign = Vec::new();
        for payload in wasmparser::Parser::new(0).parse_all(module) {
            // A module wasmparser cannot read is left to wit-component, which says why.
            let Ok(wasmparser::Payload::ImportSection(section)) = payload else { continue };
            for import in section.into_imports().flatten() {
                if !allowed.iter().any(|a| a == import.module) {
                    foreign.push(format!("`{}::{}`", import.module, import.name));
                }
            }
        }
        if foreign.is_empty() {
            return Ok(());
        }
        let hint = if foreign.iter().any(|f| f.starts_with("`wasi")) {
            "WASI comes from building for wasm32-wasip1/wasip2 (println!, std::fs, std::env, std::time need it there): build for wasm32-unknown-unknown, as plugins/build.sh does, and log with the SDK (`wasmswitch_plugin_sdk::log(Level::Info, ...)`) instead of println!"
        } else {
            "a C plugin must define every function it calls (there is no libc), a Rust plugin must not link a crate that imports host functions of its own"
        };
        bail!(
            "imports {}, outside the wasmswitch:plugin world: a plugin may import only {} (the switch grants no other capability: no filesystem, sockets, environment, clock or WASI at all). {hint}",
            foreign.join(", "),
            allowed.join(", ")
        )
    }
}
