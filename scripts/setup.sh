#!/usr/bin/env bash
# Installs what building, the demo and the tests need on a fresh Debian 12 machine (run as root).
# Idempotent: packages already present are not fetched again.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have ping     || need+=(iputils-ping)
have ip       || need+=(iproute2)
have nsenter  || need+=(util-linux)
have promtool || need+=(prometheus)
have iperf3   || need+=(iperf3)
have ethtool  || need+=(ethtool)
# Instruction counts of the benchmark (benches/count.sh), checked by test.sh.
have valgrind || need+=(valgrind)
# Open vSwitch: the second reference of switch/tests/vlan_reference.rs (and benches/veth).
have ovs-vswitchd || need+=(openvswitch-switch)
if [ "${WASMSWITCH_SKIP_WASM:-0}" != 1 ]; then
  # Wasm guests: Debian's rustc-web ships a wasm32 std source we build with -Zbuild-std
  # (rustup cannot fetch a wasm32 target here); see plugins/build.sh.
  have /usr/bin/rustc      || need+=(rustc-web)
  [ -d /usr/lib/rustlib/src/rust/library ] || need+=(rust-web-src)
  have /usr/lib/llvm-19/bin/wasm-ld || need+=(lld-19)
  # The C example plugin (plugins/examples/c-portdeny); build.sh installs its wit-bindgen.
  have clang-19            || need+=(clang-19)
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing packages ${need[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d: packages such as prometheus must not start services on install.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi
# bpffs is not needed (nothing is pinned); AF_XDP, BPF links and veth need root only.
