#!/usr/bin/env bash
# Instructions and simulated cache misses per packet of `wasmswitch bench` scenarios, counted by
# callgrind: the same figures whatever else the machine is doing, so two builds compare on a
# noisy VM where timed rounds disagree by 10-50 %. Counts only what runs inside the bench's
# timed loop (`bench::timed`), not the set-up or the warm-up. One worker, one process per
# scenario. The caches are simulated with this VM's per-core sizes (32 KiB D1, 1 MiB L2 as the
# last level). What it cannot see: stalls (a miss is counted, not timed), the TLB, the L3, and
# anything the other core does.
#
#   benches/count.sh [--bin PATH] [--seconds S] [--scenario NAME]... [--plugin WASM --plugin-config FILE]
#
# Default: floor, passthrough, l2, l2-vlan, l2-parse-all (and l2+plugin with --plugin), 0.5 s
# each (under valgrind that is some 100,000-400,000 packets), the release build of this tree.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/wasmswitch
seconds=0.5
scenarios=()
plugin_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --scenario) scenarios+=("$2"); shift 2 ;;
        --plugin | --plugin-config) plugin_args+=("$1" "$2"); shift 2 ;;
        -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "count.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "count.sh: valgrind is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
if [[ "$bin" == target/release/wasmswitch ]]; then
    cargo build --release -q -p wasmswitch
fi
[[ -x "$bin" ]] || { echo "count.sh: no binary at $bin" >&2; exit 1; }
if [[ ${#scenarios[@]} -eq 0 ]]; then
    scenarios=(floor passthrough l2 l2-vlan l2-parse-all)
    [[ ${#plugin_args[@]} -gt 0 ]] && scenarios+=(l2+plugin)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%-16s %10s %10s %12s %12s\n' scenario packets Ir/pkt "D1 miss/pkt" "L2 miss/pkt"
for s in "${scenarios[@]}"; do
    out="$work/callgrind.$s"
    # The bench's own argument checks answer first: an unknown scenario fails here, named.
    if ! valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 --LL=1048576,8,64 --collect-atstart=no \
        --toggle-collect='wasmswitch::bench::timed*' --callgrind-out-file="$out" \
        "$bin" bench --json --scenario "$s" --seconds "$seconds" "${plugin_args[@]}" \
        >"$work/$s.json" 2>"$work/$s.log"; then
        echo "count.sh: the bench of '$s' failed:" >&2
        grep -v -E '^(==|--)[0-9]+(==|--)' "$work/$s.log" >&2 || true
        exit 1
    fi
    python3 - "$s" "$out" "$work/$s.json" <<'EOF'
import json, sys
name, out, js = sys.argv[1:]
events = totals = None
for line in open(out):
    if line.startswith("events:"):
        events = line.split()[1:]
    elif line.startswith(("totals:", "summary:")):
        totals = [int(v) for v in line.split()[1:]]
rows = [json.loads(l) for l in open(js) if l.startswith("{")]
if not rows:
    sys.exit(f"count.sh: the bench of '{name}' printed no result")
packets = rows[-1]["packets"]
if not events or not totals or packets == 0:
    sys.exit(f"count.sh: no counts for '{name}' (events {events}, totals {totals}, {packets} packets)")
c = dict(zip(events, totals))
if c.get("Ir", 0) == 0:
    sys.exit(f"count.sh: nothing counted for '{name}': is bench::timed still a function of its own?")
per = lambda *k: sum(c.get(x, 0) for x in k) / packets
print(f"{name:<16} {packets:>10} {per('Ir'):>10.1f} {per('D1mr', 'D1mw'):>12.2f} {per('DLmr', 'DLmw'):>12.3f}")
EOF
done
echo "(callgrind $(valgrind --version | sed 's/valgrind-//'), counting inside bench::timed only; caches simulated, not measured:"
echo " a 32 KiB 8-way D1 and a 1 MiB 8-way L2 as the last level, this VM's per-core sizes)"
