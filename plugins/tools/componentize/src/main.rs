//! `wasmswitch-componentize WIT_DIR CORE.wasm OUT.wasm`: wraps a plugin's core module into a
//! component of the `wasmswitch:plugin` world found in `WIT_DIR` (see the library).

use anyhow::{bail, Context, Result};
use wasmswitch_componentize::World;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [wit, input, output] = args.as_slice() else {
        bail!("usage: wasmswitch-componentize WIT_DIR CORE.wasm OUT.wasm");
    };
    let world = World::from_dir(wit.as_ref())?;
    let module = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    let component = world.componentize(&module, input)?;
    std::fs::write(output, component).with_context(|| format!("writing {output}"))?;
    Ok(())
}
