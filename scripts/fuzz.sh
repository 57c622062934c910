#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 20) and prints one line per
# target: executions, libFuzzer's final coverage (`cov:`) and the result. Exits non-zero when a
# target crashed (the input is left in fuzz/artifacts/TARGET/: copy it into fuzz/corpus/TARGET/
# with the fix, and the stable replay tests keep it checked).
#
# Needs the nightly toolchain (libFuzzer's sanitizer build); installs cargo-fuzz if missing.
# Without nightly it says so and exits 0: the corpora are still replayed by `cargo test` on
# stable. New inputs go to fuzz/corpus-work/ (ignored by git); fuzz/corpus/ holds the seeds.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-20}
case $secs in '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain (cargo +nightly): fuzzing skipped; the corpora are replayed by cargo test"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz"
  cargo +nightly install cargo-fuzz --locked || exit 1
fi

start=$(date +%s)
# Build all targets first, so each target's time is spent fuzzing.
cargo +nightly fuzz build || exit 1
targets=$(cargo +nightly fuzz list) || exit 1
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT
lines=()
failed=0
for t in $targets; do
  mkdir -p "corpus-work/$t"
  log=$log_dir/$t.log
  # The work corpus first: libFuzzer writes new inputs to the first directory only.
  cargo +nightly fuzz run "$t" "corpus-work/$t" "corpus/$t" -- \
    -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # The last status line (DONE on success; the last progress line before a crash).
  cov=$(grep -oE '^#[0-9]+.*cov: [0-9]+' "$log" | tail -1 | sed 's/.*cov: //')
  if [ $rc -eq 0 ]; then
    result=ok
  else
    failed=1
    artifact=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
    result="CRASH (exit $rc${artifact:+, input $artifact})"
    # The panic message and the first frames, for the log.
    grep -m1 -A12 -E 'panicked at|ERROR: AddressSanitizer|ERROR: libFuzzer' "$log" | sed "s/^/  $t: /"
  fi
  lines+=("$(printf '%-16s execs %-10s cov %-6s %s' "$t" "${execs:-?}" "${cov:-?}" "$result")")
done
echo
echo "== fuzz: ${secs}s per target"
printf '%s\n' "${lines[@]}"
echo "fuzz.sh: done in $(($(date +%s) - start))s"
exit $failed
