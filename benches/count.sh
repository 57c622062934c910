#!/usr/bin/env bash
# Instructions and simulated cache misses per packet of `wasmswitch bench` scenarios, counted by
# callgrind: the same figures whatever else the machine is doing, so two builds compare on a
# noisy VM where timed rounds disagree by 10-50 %. Counts only what runs inside the bench's
# timed loop (`bench::timed`), not the set-up or the warm-up. One worker, one process per
# scenario. The caches are simulated with this VM's per-core sizes (32 KiB D1, 1 MiB L2 as the
# last level). What it cannot see: stalls (a miss is counted, not timed), the TLB, the L3, and
# anything the other core does.
#
#   benches/count.sh [--bin PATH] [--against PATH] [--seconds S] [--scenario NAME]...
#                    [--plugin WASM --plugin-config FILE] [--batch N]
#
# --against adds a second build's counts and the change from it to --bin, scenario by scenario.
# Default: floor, passthrough, l2, l2-vlan, l2-parse-all (and l2+plugin with --plugin), 0.5 s
# each (under valgrind that is some 100,000-400,000 packets), the release build of this tree.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/wasmswitch
against=
seconds=0.5
scenarios=()
plugin_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --against) against="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --scenario) scenarios+=("$2"); shift 2 ;;
        --plugin | --plugin-config | --batch) plugin_args+=("$1" "$2"); shift 2 ;;
        -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "count.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "count.sh: valgrind is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
if [[ "$bin" == target/release/wasmswitch ]]; then
    cargo build --release -q -p wasmswitch
fi
for b in "$bin" ${against:+"$against"}; do
    [[ -x "$b" ]] || { echo "count.sh: no binary at $b" >&2; exit 1; }
done
if [[ ${#scenarios[@]} -eq 0 ]]; then
    scenarios=(floor passthrough l2 l2-vlan l2-parse-all)
    [[ ${#plugin_args[@]} -gt 0 ]] && scenarios+=(l2+plugin)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# count BIN SCENARIO: prints "packets Ir/pkt D1-misses/pkt L2-misses/pkt".
count() {
    local b=$1 s=$2 out="$work/callgrind" log="$work/log" js="$work/json"
    # The bench's own argument checks answer first: an unknown scenario fails here, named.
    if ! valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 --LL=1048576,8,64 --collect-atstart=no \
        --toggle-collect='*::bench::timed*' --callgrind-out-file="$out" \
        "$b" bench --json --scenario "$s" --seconds "$seconds" "${plugin_args[@]}" >"$js" 2>"$log"; then
        echo "count.sh: the bench of '$s' ($b) failed:" >&2
        grep -v -E '^(==|--)[0-9]+(==|--)' "$log" >&2 || true
        return 1
    fi
    python3 - "$s" "$out" "$js" <<'EOF'
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
print(packets, f"{per('Ir'):.1f}", f"{per('D1mr', 'D1mw'):.2f}", f"{per('DLmr', 'DLmw'):.3f}")
EOF
}

if [[ -z "$against" ]]; then
    printf '%-22s %10s %10s %12s %12s\n' scenario packets Ir/pkt "D1 miss/pkt" "L2 miss/pkt"
else
    printf '%-22s %14s %10s %8s %14s %14s\n' scenario "Ir/pkt against" "Ir/pkt" change "D1 miss/pkt" "L2 miss/pkt"
fi
# A failed count prints nothing, so its `read` fails and the script stops there.
for s in "${scenarios[@]}"; do
    read -r packets ir d1 l2 < <(count "$bin" "$s") || exit 1
    if [[ -z "$against" ]]; then
        printf '%-22s %10s %10s %12s %12s\n' "$s" "$packets" "$ir" "$d1" "$l2"
    else
        read -r _ a_ir a_d1 a_l2 < <(count "$against" "$s") || exit 1
        change=$(python3 -c "print(f'{($ir - $a_ir) / $a_ir * 100:+.1f}%')")
        printf '%-22s %14s %10s %8s %14s %14s\n' "$s" "$a_ir" "$ir" "$change" "$a_d1 -> $d1" "$a_l2 -> $l2"
    fi
done
echo "(callgrind $(valgrind --version | sed 's/valgrind-//'), counting inside bench::timed only; caches simulated, not measured:"
echo " a 32 KiB 8-way D1 and a 1 MiB 8-way L2 as the last level, this VM's per-core sizes)"
