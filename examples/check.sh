#!/usr/bin/env bash
# Validates everything under examples/: the systemd unit, the Prometheus rules and their unit
# tests, the Grafana dashboard's structure and PromQL, the Kubernetes manifests. One line per
# check; exits non-zero if any failed. On a fresh Debian machine as root it installs what it
# needs (prometheus for promtool, systemd for systemd-analyze, python3-venv; kubernetes-validate
# from PyPI into a venv). Under CI=true a check that cannot run is a failure, not a skip.
#
# Environment: WASMSWITCH_EXAMPLES_VENV (default target/examples-venv) for the venv;
# WASMSWITCH_BIN (default target/{release,debug}/wasmswitch if built) to `check` the
# ConfigMap's switch.yaml with the real config loader.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
venv=${WASMSWITCH_EXAMPLES_VENV:-$repo/target/examples-venv}
# Pinned: the schemas it validates against come with its version.
kv_pkg=kubernetes-validate==1.37.0
ci=false; [ "${CI:-}" = true ] && ci=true
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok()   { printf 'ok    %s\n' "$1"; }
fail() { printf 'FAIL  %s\n' "$1"; [ -n "${2:-}" ] && sed 's/^/      /' <<<"$2"; failed=1; }
# A check that cannot run: skipped on a developer machine, failed under CI.
cannot() {
  if $ci; then fail "$1 (cannot run under CI=true)" "$2"; else printf 'SKIP  %s: %s\n' "$1" "$2"; fi
}
# run NAME CMD...: one line for the command's result, its output only on failure.
run() {
  local name=$1 out; shift
  if out=$("$@" 2>&1); then ok "$name"; else fail "$name" "$out"; fi
}
have() { command -v "$1" >/dev/null 2>&1; }

# --- what the checks need ---------------------------------------------------------------------
need=()
have promtool || need+=(prometheus)
have systemd-analyze || need+=(systemd)
have python3 || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && have apt-get; then
    echo "check: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The prometheus package must not start a server on install; keep an existing policy.
    own_policy=false
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=true
    fi
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
      fail "install ${need[*]}"
    $own_policy && rm -f /usr/sbin/policy-rc.d
  else
    echo "check: missing ${need[*]} (run as root on Debian to install them)"
  fi
fi
if [ ! -x "$venv/bin/kubernetes-validate" ] && have python3; then
  out=$( { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "$kv_pkg"; } 2>&1) ||
    echo "check: cannot install $kv_pkg into $venv: $(tail -n 3 <<<"$out")"
fi

# --- systemd ----------------------------------------------------------------------------------
if have systemd-analyze; then
  run "systemd: unit verifies, capabilities match README" "$here/systemd/check.sh"
else
  cannot "systemd" "systemd-analyze is not installed"
fi

# --- Prometheus -------------------------------------------------------------------------------
if have promtool; then
  run "prometheus: promtool check rules" promtool check rules "$here/prometheus/wasmswitch-rules.yml"
  run "prometheus: promtool test rules (each alert fires and stays quiet)" \
    bash -c "cd '$here/prometheus' && promtool test rules wasmswitch-rules.test.yml"
else
  cannot "prometheus" "promtool is not installed"
fi

# --- Grafana ----------------------------------------------------------------------------------
if have python3 && have promtool; then
  if out=$(python3 "$here/checks.py" grafana "$here/grafana/wasmswitch-dashboard.json" "$tmp/dash.yml" 2>&1); then
    run "grafana: dashboard structure and every panel's PromQL parses" promtool check rules "$tmp/dash.yml"
  else
    fail "grafana: dashboard structure" "$out"
  fi
else
  cannot "grafana" "needs python3 and promtool"
fi

# --- Kubernetes -------------------------------------------------------------------------------
kdir=$here/kubernetes
if [ -x "$venv/bin/kubernetes-validate" ]; then
  run "kubernetes: kubernetes-validate --strict configmap.yaml daemonset.yaml" \
    "$venv/bin/kubernetes-validate" --strict --quiet "$kdir/configmap.yaml" "$kdir/daemonset.yaml"
  # PodMonitor is a CRD kubernetes-validate has no schema for: parse it, and check what ties it
  # (and the DaemonSet) to the rest: labels, named ports, probes, capabilities vs README.
  run "kubernetes: podmonitor parses; manifests agree with each other and README" \
    "$venv/bin/python" "$here/checks.py" kubernetes "$kdir" "$repo/README.md"
  bin=${WASMSWITCH_BIN:-}
  for b in "$repo/target/release/wasmswitch" "$repo/target/debug/wasmswitch"; do
    [ -z "$bin" ] && [ -x "$b" ] && bin=$b
  done
  if [ -n "$bin" ]; then
    # The token file is checked when the config loads: point it at a private scratch token.
    "$venv/bin/python" "$here/checks.py" switch-yaml "$kdir/configmap.yaml" "$tmp/switch.yaml" &&
      printf 'example-token-0123456789\n' >"$tmp/token" && chmod 600 "$tmp/token" &&
      sed -i "s#/etc/wasmswitch-token/token#$tmp/token#" "$tmp/switch.yaml"
    run "kubernetes: configmap's switch.yaml passes wasmswitch check" "$bin" check -c "$tmp/switch.yaml"
  else
    printf 'SKIP  kubernetes: wasmswitch check on the configmap: no built binary (set WASMSWITCH_BIN)\n'
  fi
else
  cannot "kubernetes" "kubernetes-validate is not installed in $venv (PyPI unreachable?)"
fi

exit $failed
