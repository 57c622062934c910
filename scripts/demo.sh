#!/usr/bin/env bash
# The switch's main job on its built-in lab: three hosts in network namespaces on veth pairs,
# switched through AF_XDP, pinged across, live per-port rates until Ctrl-C. Without root it
# runs the sim lab instead. Arguments go to `wasmswitch demo` (e.g. --seconds 10).
set -euo pipefail
cd "$(dirname "$0")/.."
WASMSWITCH_SKIP_WASM=1 scripts/setup.sh
cargo build --release -q -p wasmswitch
exec target/release/wasmswitch demo "$@"
