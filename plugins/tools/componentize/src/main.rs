//! `wasmswitch-componentize WIT_DIR CORE.wasm OUT.wasm`
//!
//! Embeds the `wasmswitch:plugin` world (from `WIT_DIR`) into a core module built by the SDK
//! and encodes the result as a component, validating that the module's imports and exports
//! match the world's canonical-ABI signatures. This is what `wasm-tools component embed` +
//! `wasm-tools component new` do, without needing that CLI installed.

use anyhow::{bail, Context, Result};
use wit_component::{embed_component_metadata, ComponentEncoder, StringEncoding};
use wit_parser::Resolve;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [wit, input, output] = args.as_slice() else {
        bail!("usage: wasmswitch-componentize WIT_DIR CORE.wasm OUT.wasm");
    };
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve.push_dir(wit).with_context(|| format!("parsing WIT in {wit}"))?;
    let world = resolve.select_world(&[pkg], Some("plugin"))?;
    let mut module = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8)?;
    let component = ComponentEncoder::default()
        .module(&module)
        .with_context(|| format!("{input}: not a plugin module"))?
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
            e.context(format!("{input}: does not match the wasmswitch:plugin world{hint}"))
        })?;
    std::fs::write(output, component).with_context(|| format!("writing {output}"))?;
    Ok(())
}
