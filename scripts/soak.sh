#!/usr/bin/env bash
# Soak under faults: the AF_XDP lab (host port and plugins included) under iperf3 traffic while
# links flap, an interface is deleted and re-created, plugin faults are injected, reloads storm
# and the API is abused; then zero frames leaked, RSS within bound, every port forwarding,
# exit 0 on SIGTERM. A 20-second run is part of scripts/test.sh.
#   scripts/soak.sh [MINUTES]     (default 5; needs root)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-5}"
case "$minutes" in ''|*[!0-9]*) echo "usage: scripts/soak.sh [MINUTES]" >&2; exit 2 ;; esac
[ -f plugins/out/acl.wasm ] || plugins/build.sh
echo "soak: ${minutes} minute(s)"
set +e
WASMSWITCH_SOAK_SECONDS=$((minutes * 60)) cargo test --workspace --test soak -- --nocapture 2>&1 \
  | grep -A2 -E '^soak |test result|panicked|FAILED'
rc=${PIPESTATUS[0]}
exit "$rc"
