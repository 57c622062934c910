#!/usr/bin/env bash
# The switch's main job on its built-in lab: three hosts in network namespaces on veth pairs,
# switched through AF_XDP with the acl plugin (WebAssembly) deciding on h1's ingress: pings
# pass, a TCP flow is denied, the rule is hot-reloaded and the flow passes, with live rates and
# verdict counters (redrawn in place on a terminal) until Ctrl-C. Without root it runs the sim
# lab instead. Arguments go to `wasmswitch demo` (e.g. --seconds 10).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
plugins/build.sh acl >/dev/null
cargo build --release -q -p wasmswitch
exec target/release/wasmswitch demo "$@"
