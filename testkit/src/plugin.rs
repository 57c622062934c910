//! Plugins for tests: hand-made components from WAT (faulting, spinning, counting ones), and
//! the example plugins as `plugins/build.sh` built them.

/// A plugin component whose `process` runs the WAT `body` (e.g. `(loop $l (br $l))` to spin,
/// `(unreachable)` to trap) and whose `init` accepts any config.
pub fn plugin_with_process(body: &str) -> Vec<u8> {
    plugin_with_init_and_process("", body)
}

/// [`plugin_with_process`] whose `init` first runs the WAT `init` (a local `$i` is there for it).
pub fn plugin_with_init_and_process(init: &str, body: &str) -> Vec<u8> {
    plugin_with_imports("", init, body)
}

/// A plugin whose `init` registers a counter named by its config and adds 5 to it; `process`
/// passes every packet.
pub fn counting_plugin() -> Vec<u8> {
    let imports = r#"(import "wasmswitch:plugin/host@0.2.0" "register-counter" (func $reg (param i32 i32 i32)))
  (import "wasmswitch:plugin/host@0.2.0" "counter-add" (func $add (param i32 i64)))"#;
    // The config is at 1024 (where `cabi_realloc` puts everything), its length in local 1.
    let init = "(call $reg (i32.const 1024) (local.get 1) (i32.const 192))
        (call $add (i32.load (i32.const 196)) (i64.const 5))";
    let body = "(i32.store (i32.const 32) (i32.const 32768))
        (i32.store (i32.const 36) (i32.mul (i32.load16_u offset=2 (local.get 0)) (i32.const 4)))
        (memory.fill (i32.const 32768) (i32.const 0) (i32.load (i32.const 36)))
        (return (i32.const 32))";
    plugin_with_imports(imports, init, body)
}

/// [`plugin_with_init_and_process`] with the WAT `imports` (and data) at the module's top.
pub fn plugin_with_imports(imports: &str, init: &str, body: &str) -> Vec<u8> {
    let core = format!(
        r#"(module
  {imports}
  (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "init") (param i32 i32) (result i32)
    (local $i i32)
    {init}
    (i32.store8 (i32.const 16) (i32.const 0))
    (i32.const 16))
  (func (export "process") (param i32 i32) (result i32)
    {body}
    (unreachable))
)"#
    );
    // Wrapped by the code plugins/build.sh and `wasmswitch plugin build` use.
    let module = wat::parse_str(core).unwrap();
    wasmswitch_componentize::World::embedded().unwrap().componentize(&module, "test module").unwrap()
}

/// A plugin that passes every packet for its first `calls` batch calls, then traps on every
/// call (an instance made after a fault starts counting again): a fault at run time that
/// `check`'s smoke run, some 30 calls, does not see.
pub fn plugin_that_faults_after(calls: u32) -> Vec<u8> {
    plugin_with_process(&format!(
        "(i32.store (i32.const 8) (i32.add (i32.load (i32.const 8)) (i32.const 1)))
         (if (i32.gt_u (i32.load (i32.const 8)) (i32.const {calls})) (then unreachable))
         (i32.store (i32.const 32) (i32.const 32768))
         (i32.store (i32.const 36) (i32.mul (i32.load16_u offset=2 (local.get 0)) (i32.const 4)))
         (return (i32.const 32))"
    ))
}

/// A plugin that spins in every batch call (stopped by its deadline each time).
pub fn spinning_plugin() -> Vec<u8> {
    plugin_with_process("(loop $l (br $l))")
}

/// Wraps a core module (WAT) into a component of `wit` (the real world when `None`).
pub fn component(core_wat: &str, wit: Option<&str>) -> Vec<u8> {
    component_with_strings(core_wat, wit, wit_component::StringEncoding::UTF8)
}

/// [`component`] whose strings cross the boundary in `encoding`.
pub fn component_with_strings(core_wat: &str, wit: Option<&str>, encoding: wit_component::StringEncoding) -> Vec<u8> {
    let mut resolve = wit_parser::Resolve::default();
    let pkg = match wit {
        None => resolve.push_dir(crate::repo().join("wit")).unwrap().0,
        Some(text) => resolve.push_str("test.wit", text).unwrap(),
    };
    let world = resolve.select_world(&[pkg], None).unwrap();
    let mut module = wat::parse_str(core_wat).unwrap();
    wit_component::embed_component_metadata(&mut module, &resolve, world, encoding).unwrap();
    wit_component::ComponentEncoder::default().module(&module).unwrap().validate(true).encode().unwrap()
}

/// `plugins/out/NAME.wasm` when it is built. Missing, it is a failure under CI=true (the test
/// command builds it first) and a skip, said on stderr, elsewhere.
pub fn example_plugin(name: &str) -> Option<std::path::PathBuf> {
    let path = crate::repo().join(format!("plugins/out/{name}.wasm"));
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} missing: scripts/test.sh builds it first",
        path.display()
    );
    eprintln!("skipped: build the plugins with plugins/build.sh");
    None
}
