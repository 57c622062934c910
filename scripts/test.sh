#!/usr/bin/env bash
# The whole test suite. As root (as in CI) the namespace/veth/AF_XDP/TAP tests run and must
# pass; with CI=true they fail rather than skip when something they need is missing.
#
# Every stage runs even when an earlier one failed (a red first stage must not hide the state
# of the rest); the summary at the end lists each stage's result and the script exits non-zero
# if any failed. Setup and the plugin build are the exception: without them the later stages
# cannot mean anything, so their failure stops the run.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
results=()
failed=0

# stage NAME COMMAND...: runs COMMAND, records "ok"/"FAILED (exit N)" and its duration.
stage() {
  local name=$1; shift
  local t0=$(date +%s)
  echo "== $name"
  "$@"
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    results+=("ok      ${dt}s  $name")
  else
    results+=("FAILED  ${dt}s  $name (exit $rc)")
    failed=1
  fi
  return $rc
}

summary() {
  echo
  echo "== summary"
  printf '%s\n' "${results[@]}"
  echo "test.sh: done in $(( $(date +%s) - start ))s"
}

check_configs() {
  # The binary the workspace tests just built: `cargo run -p wasmswitch` alone would unify
  # features differently and compile wasmtime a second time (about 10 minutes here).
  local rc=0
  for c in configs/*.yaml; do target/debug/wasmswitch check -c "$c" || rc=1; done
  return $rc
}

if ! stage "setup" scripts/setup.sh || ! stage "build Wasm plugins" plugins/build.sh; then
  summary
  exit 1
fi
stage "cargo fmt --check (workspace)" cargo fmt --all --check
stage "cargo fmt --check (plugins)" bash -c 'cd plugins && cargo fmt --all --check'
# One profile for everything (test, opt-level 2): wasmtime is compiled once.
stage "cargo test (workspace)" cargo test --workspace --no-fail-fast -- --test-threads=2
stage "cargo clippy (workspace)" cargo clippy --workspace --all-targets -- -D warnings
stage "cargo test (plugin crates, native harness)" bash -c 'cd plugins && cargo test --workspace --no-fail-fast'
stage "cargo clippy (plugins)" bash -c 'cd plugins && cargo clippy --workspace --all-targets -- -D warnings'
stage "configs" check_configs
# Every fuzz target for 20 s where the nightly toolchain is (it prints a line and passes where
# it is not: the corpora are replayed on stable by the workspace tests anyway).
stage "fuzz (cargo-fuzz, 20 s per target)" scripts/fuzz.sh 20
# The instruction-count benchmark on the binary the workspace tests built (same profile,
# opt-level 2): a short run, so that its toggle on bench::timed cannot rot unnoticed.
stage "instruction counts (benches/count.sh, short)" benches/count.sh --bin target/debug/wasmswitch --scenario floor --scenario l2 --seconds 0.1
# After the workspace tests: the Kubernetes ConfigMap is checked with the binary they built.
stage "examples (systemd, prometheus, grafana, kubernetes)" env WASMSWITCH_BIN=target/debug/wasmswitch examples/check.sh
summary
exit $failed
