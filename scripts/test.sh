#!/usr/bin/env bash
# The whole test suite. As root (as in CI) the namespace/veth/AF_XDP/TAP tests run and must
# pass; with CI=true they fail rather than skip when something they need is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
echo "== building Wasm plugins"
plugins/build.sh
echo "== cargo test (workspace)"
# One profile for everything (test, opt-level 2): wasmtime is compiled once.
cargo test --workspace --no-fail-fast -- --test-threads=2
echo "== plugin crates (native harness)"
(cd plugins && cargo test --workspace --no-fail-fast)
echo "== configs"
# The binary the workspace tests just built: `cargo run -p wasmswitch` alone would unify
# features differently and compile wasmtime a second time (about 10 minutes here).
for c in configs/*.yaml; do target/debug/wasmswitch check -c "$c"; done
echo "test.sh: done in $(( $(date +%s) - start ))s"
