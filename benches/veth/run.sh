#!/usr/bin/env bash
# veth topology benchmark: gen-ns --veth--> switch-ns --veth--> sink-ns, 64-byte UDP.
#
#   sudo benches/veth/run.sh [--quick] [--out DIR] [--only LIST] [--perf]
#
# Switches compared in one invocation, same generator, same topology, same CPUs:
#   ws-cross   wasmswitch daemon, `switch.mode: cross` (port i -> port i^1, no parse/lookup:
#              the two-port equivalent of `passthrough`, which would send frames back out of
#              the ingress port), AF_XDP native + copy on the switch-side veth ends
#   ws-l2      wasmswitch daemon, `switch.mode: l2` (parse, learn, FDB lookup)
#   ovs        Open vSwitch userspace datapath (netdev), type=afxdp ports, xdp-mode=native, NORMAL
#   bridge     Linux bridge (br_netfilter active as on this machine), RPS steers it to CPU 1
#
# The generator (benches/gen, AF_XDP TX in copy mode, no XDP program) is pinned to CPU 0, the
# switching work to CPU 1. Delivered = rx_packets of the sink veth (the sink has no address and
# the frames' destination MAC is not its own, so its stack drops them right away).
#
# Phases: (1) saturation: generator at max rate; (2) the same offered load for every switch
# (98% of the lowest saturation offer of phase 1); (3) a short binary search for the highest
# rate with loss <= ZL_TOL (default 0.01%).
# Writes $OUT/veth.json and $OUT/veth.png, prints a table. Everything it creates (namespaces,
# veths, OVS processes and database, temp files) is removed on exit, Ctrl-C or error.
#
# Environment: WASMSWITCH, WASMSWITCH_GEN (binaries; default target/release/...),
# ZL_TOL (loss fraction counted as zero loss), NO_INSTALL=1 (skip apt-get).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/bench-results
QUICK=0
ONLY="ws-cross,ws-l2,ovs,bridge"
PERF=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --perf) PERF=1 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "needs 2 CPUs (generator on 0, switch on 1)" >&2; exit 1; }

if [ $QUICK = 1 ]; then SAT_S=2; LOAD_S=2; BS_S=1; BS_STEPS=3; else SAT_S=5; LOAD_S=5; BS_S=2; BS_STEPS=5; fi
ZL_TOL=${ZL_TOL:-0.0001}
WASMSWITCH=${WASMSWITCH:-$ROOT/target/release/wasmswitch}
GEN=${WASMSWITCH_GEN:-$ROOT/target/release/wasmswitch-gen}
PY=/usr/bin/python3
SRC_MAC=02:5b:00:00:00:01
DST_MAC=02:5b:00:00:00:02
METRICS=127.0.0.1:19187

log() { echo "[veth] $*" >&2; }

# ---- prerequisites -------------------------------------------------------------------------
need_pkgs=()
command -v ovs-vswitchd >/dev/null || need_pkgs+=(openvswitch-switch)
$PY -c 'import matplotlib' 2>/dev/null || need_pkgs+=(python3-matplotlib)
command -v jq >/dev/null || need_pkgs+=(jq)
command -v curl >/dev/null || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ] && [ -z "${NO_INSTALL:-}" ]; then
  log "installing ${need_pkgs[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
if [ ! -x "$WASMSWITCH" ] || [ ! -x "$GEN" ]; then
  log "building wasmswitch and wasmswitch-gen (release)"
  (cd "$ROOT" && cargo build --release -p wasmswitch -p wasmswitch-gen)
fi

# ---- topology and cleanup ------------------------------------------------------------------
PFX="wsv$$"
NS_GEN=$PFX-gen NS_SW=$PFX-sw NS_SINK=$PFX-sink
TMP=$(mktemp -d /tmp/wasmswitch-veth.XXXXXX)
SW_PID=""
cleanup() {
  set +e
  stop_switch 2>/dev/null
  for ns in $NS_GEN $NS_SW $NS_SINK; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_gen() { ip netns exec "$NS_GEN" "$@"; }
in_sw() { ip netns exec "$NS_SW" "$@"; }
in_sink() { ip netns exec "$NS_SINK" "$@"; }

setup_topology() {
  for ns in $NS_GEN $NS_SW $NS_SINK; do
    ip netns add "$ns"
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
  done
  ip link add g0 netns "$NS_GEN" type veth peer name swa netns "$NS_SW"
  ip link add swb netns "$NS_SW" type veth peer name k0 netns "$NS_SINK"
  ip -n "$NS_GEN" link set g0 up
  ip -n "$NS_SW" link set swa up
  ip -n "$NS_SW" link set swb up
  ip -n "$NS_SINK" link set k0 up
}

sink_rx() { in_sink cat /sys/class/net/k0/statistics/rx_packets; }
# Non-idle jiffies of CPU 1 (user nice system irq softirq steal).
cpu1_busy() { awk '$1=="cpu1"{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
metric_sum() { awk -v m="$1" 'index($0, m) == 1 && ($0 ~ "^" m "[ {]") {s += $NF} END {printf "%.0f\n", s}'; }

# ---- switches ------------------------------------------------------------------------------
# shellcheck source=lib.sh
. "$ROOT/benches/veth/lib.sh"

# Switch-side cycle counter: prints "cycles packets" (TSC cycles and the packets they cover).
switch_counters() {
  case $CUR in
    ws-*)
      local m; m=$(in_sw curl -sf "http://$METRICS/metrics")
      echo "$(metric_sum wasmswitch_worker_busy_cycles_total <<<"$m") $(metric_sum wasmswitch_worker_packets_total <<<"$m")" ;;
    ovs)
      appctl dpif-netdev/pmd-stats-show > "$TMP/pmd-stats.txt"
      cp "$TMP/pmd-stats.txt" "$OUT/veth-ovs-pmd-stats.txt"
      awk '/^pmd thread/ {in_pmd=1} /^main thread/ {in_pmd=0}
           in_pmd && /^ *processing cycles:/ {c+=$3} in_pmd && /packets received:/ {p+=$3}
           END {print c+0, p+0}' "$TMP/pmd-stats.txt" ;;
    bridge) echo "$(cpu1_busy) 0" ;;
  esac
}

# Teach every learning switch where both MACs live (a few frames each way), outside the window.
prime() {
  in_gen "$GEN" --iface g0 --src-mac $SRC_MAC --dst-mac $DST_MAC --count 8 --duration 1 >/dev/null
  in_sink "$GEN" --iface k0 --src-mac $DST_MAC --dst-mac $SRC_MAC --count 8 --duration 1 >/dev/null
  sleep 0.2
}

# trial RATE SECONDS -> one JSON object
trial() {
  local rate=$1 secs=$2
  prime
  local rx0 c0 rx1 c1 g
  rx0=$(sink_rx); c0=$(switch_counters)
  g=$(in_gen taskset -c 0 "$GEN" --iface g0 --cpu 0 --src-mac $SRC_MAC --dst-mac $DST_MAC --flows 64 --size 64 --rate "$rate" --duration "$secs")
  sleep 0.3
  rx1=$(sink_rx); c1=$(switch_counters)
  $PY - "$CUR" "$rate" "$rx0" "$rx1" "$c0" "$c1" "$TSC_HZ" "$g" <<'EOF'
import json, sys, os
sw, rate, rx0, rx1, c0, c1, tsc, g = sys.argv[1:]
g = json.loads(g)
delivered = int(rx1) - int(rx0)
sent = g["sent"]; dur = g["duration_s"]
(cy0, p0), (cy1, p1) = [tuple(float(x) for x in c.split()) for c in (c0, c1)]
if sw == "bridge":
    # /proc/stat jiffies of CPU 1 spent outside idle, in TSC cycles, per delivered packet.
    hz = os.sysconf("SC_CLK_TCK")
    cyc = (cy1 - cy0) / hz * float(tsc)
    cpp = cyc / delivered if delivered else None
    basis = "non-idle CPU 1 time (/proc/stat) x TSC Hz / delivered"
else:
    cpp = (cy1 - cy0) / (p1 - p0) if p1 > p0 else None
    basis = "switch busy TSC cycles / packets it received"
print(json.dumps({
    "switch": sw, "target": rate, "duration_s": dur, "sent": sent, "delivered": delivered,
    "offered_pps": sent / dur, "delivered_pps": delivered / dur,
    "loss": max(0.0, (sent - delivered) / sent) if sent else None,
    "cycles_per_pkt": cpp, "cycles_basis": basis, "gen": g}))
EOF
}

field() { jq -r ".$2" <<<"$1"; }

# ---- run -----------------------------------------------------------------------------------
mkdir -p "$OUT"
setup_topology
TSC_HZ=$("$GEN" --tsc-hz | jq -r .tsc_hz)
# Anything else running on these 2 CPUs (a build...) skews every number: measure it and say so.
BG_BUSY=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; sleep 2; awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
BG_BUSY=$(echo $BG_BUSY | awk '{b=$3-$1; i=$4-$2; printf "%.3f", (b+i) ? b/(b+i) : 0}')
if awk -v b="$BG_BUSY" 'BEGIN{exit !(b > 0.05)}'; then
  log "WARNING: the machine is $(awk -v b="$BG_BUSY" 'BEGIN{printf "%.0f", b*100}')% busy before the benchmark starts:"
  ps -eo pcpu,comm --sort=-pcpu | head -4 | sed 's/^/[veth]   /' >&2
  log "WARNING: results will be low and noisy; rerun on a quiet machine"
fi
IFS=, read -r -a SWITCHES <<<"$ONLY"
log "switches: ${SWITCHES[*]}; TSC $(printf %.0f "$TSC_HZ") Hz; quick=$QUICK"
declare -A SAT LOAD BS
RESULTS=$TMP/results.jsonl
: > "$RESULTS"

for sw in "${SWITCHES[@]}"; do
  log "$sw: saturation (${SAT_S}s at max)"
  start_switch "$sw"
  SAT[$sw]=$(trial max $SAT_S)
  log "  $(jq -c '{offered_pps, delivered_pps, loss, cycles_per_pkt}' <<<"${SAT[$sw]}")"
  if [ $PERF = 1 ] && [ "$sw" = ws-l2 ]; then
    log "$sw: perf record -C 1 during a saturation trial"
    prime
    (sleep 1; perf record -q -C 1 -o "$TMP/perf.data" -- sleep 3 >/dev/null 2>&1) &
    PERF_PID=$!
    in_gen taskset -c 0 "$GEN" --iface g0 --cpu 0 --src-mac $SRC_MAC --dst-mac $DST_MAC --rate max --duration 5 >/dev/null
    wait $PERF_PID  # not a bare `wait`: the daemon is a background job too
    perf report -i "$TMP/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep -v '^$' | head -120 > "$OUT/veth-perf-ws-l2.txt" || true
    perf report -i "$TMP/perf.data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^$' | head -40 > "$OUT/veth-perf-ws-l2-dso.txt" || true
  fi
  stop_switch
done

# The same offered load for all: a little under the lowest saturation offer.
COMMON=$(for sw in "${SWITCHES[@]}"; do field "${SAT[$sw]}" offered_pps; done | sort -g | head -1)
COMMON=$($PY -c "print(int(float('$COMMON') * 0.98 / 1000) * 1000)")
log "common offered load: $COMMON pps"

for sw in "${SWITCHES[@]}"; do
  start_switch "$sw"
  log "$sw: ${LOAD_S}s at $COMMON pps"
  LOAD[$sw]=$(trial "$COMMON" $LOAD_S)
  log "  $(jq -c '{offered_pps, delivered_pps, loss, cycles_per_pkt}' <<<"${LOAD[$sw]}")"
  # Binary search for the highest rate with loss <= ZL_TOL, between 40% and 102% of the
  # saturation delivery.
  sat_del=$(field "${SAT[$sw]}" delivered_pps)
  lo=$($PY -c "print(int(float('$sat_del') * 0.4))"); hi=$($PY -c "print(int(float('$sat_del') * 1.02))")
  best=0; steps=""
  for _ in $(seq $BS_STEPS); do
    mid=$(( (lo + hi) / 2 ))
    t=$(trial $mid $BS_S)
    loss=$(field "$t" loss)
    steps="$steps$(jq -c '{target: (.target|tonumber), offered_pps, delivered_pps, loss}' <<<"$t"),"
    if $PY -c "import sys; sys.exit(0 if float('$loss') <= $ZL_TOL else 1)"; then
      lo=$mid; best=$(field "$t" offered_pps)
    else
      hi=$mid
    fi
    log "  search: $mid pps -> loss $(printf %.5f "$loss")"
  done
  BS[$sw]="{\"zero_loss_pps\": $best, \"steps\": [${steps%,}]}"
  stop_switch
  jq -c --arg sw "$sw" -n --argjson sat "${SAT[$sw]}" --argjson load "${LOAD[$sw]}" --argjson bs "${BS[$sw]}" \
    '{switch: $sw, saturation: $sat, common_load: $load, search: $bs}' >> "$RESULTS"
done

# ---- report --------------------------------------------------------------------------------
$PY - "$RESULTS" "$OUT" "$COMMON" "$ZL_TOL" "$QUICK" "$TSC_HZ" "$BG_BUSY" <<'EOF'
import json, sys, os, platform, datetime
res_path, out, common, tol, quick, tsc, bg = sys.argv[1:]
rows = [json.loads(l) for l in open(res_path)]
names = {"ws-cross": "wasmswitch cross", "ws-l2": "wasmswitch l2", "ovs": "OVS afxdp", "bridge": "Linux bridge"}
doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "kernel": platform.release(), "quick": quick == "1", "tsc_hz": float(tsc),
       "common_offered_pps": int(common), "background_busy_before": float(bg), "zero_loss_tolerance": float(tol), "results": rows}
json.dump(doc, open(os.path.join(out, "veth.json"), "w"), indent=1)

def k(x): return "-" if x is None else f"{x/1e3:.0f}"
def c(x): return "-" if x is None else f"{x:.0f}"
def l(x): return "-" if x is None else f"{x*100:.2f}%"
hdr = ("switch", "sat offered Kpps", "sat delivered Kpps", "sat loss", "sat cyc/pkt",
       f"@{int(common)//1000}K delivered Kpps", "loss", "cyc/pkt", "zero-loss Kpps")
lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
for r in rows:
    s, L = r["saturation"], r["common_load"]
    lines.append("| " + " | ".join([names.get(r["switch"], r["switch"]), k(s["offered_pps"]), k(s["delivered_pps"]), l(s["loss"]),
        c(s["cycles_per_pkt"]), k(L["delivered_pps"]), l(L["loss"]), c(L["cycles_per_pkt"]), k(r["search"]["zero_loss_pps"] or None)]) + " |")
by = {r["switch"]: r for r in rows}
def ratio(a, b): return "-" if not a or not b else f"{a/b:.3f}x"
lines.append("")
for other, what in (("ws-cross", "wasmswitch cross"), ("ovs", "OVS afxdp")):
    if "ws-l2" in by and other in by:
        for phase in ("saturation", "common_load"):
            a, b = by["ws-l2"][phase], by[other][phase]
            lines.append(f"wasmswitch l2 / {what} ({phase}): delivered {ratio(a['delivered_pps'], b['delivered_pps'])}, "
                         f"cycles/pkt {ratio(a['cycles_per_pkt'], b['cycles_per_pkt'])}")
table = "\n".join(lines)
print(table)
open(os.path.join(out, "veth.md"), "w").write(table + "\n")

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
labels = [names.get(r["switch"], r["switch"]) for r in rows]
x = range(len(rows)); w = 0.27
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
sat = [r["saturation"]["delivered_pps"] / 1e3 for r in rows]
load = [r["common_load"]["delivered_pps"] / 1e3 for r in rows]
zl = [(r["search"]["zero_loss_pps"] or 0) / 1e3 for r in rows]
for off, vals, lab in ((-w, sat, "delivered at saturation"), (0, load, f"delivered at {int(common)//1000} Kpps offered"), (w, zl, f"zero-loss rate (loss <= {float(tol)*100:g}%)")):
    bars = ax1.bar([i + off for i in x], vals, w, label=lab)
    ax1.bar_label(bars, fmt="%.0f", fontsize=7)
ax1.set_xticks(list(x), labels); ax1.set_ylabel("Kpps (64-byte frames)"); ax1.legend(fontsize=8, loc="lower left")
ax1.set_title("gen (CPU 0) -> veth -> switch (CPU 1) -> veth -> sink")
cpp = [r["saturation"]["cycles_per_pkt"] or 0 for r in rows]
bars = ax2.bar(list(x), cpp, 0.5, color="tab:gray")
ax2.bar_label(bars, fmt="%.0f", fontsize=8)
ax2.set_xticks(list(x), labels); ax2.set_ylabel("TSC cycles per packet (switching CPU)")
ax2.set_title("cycles per packet at saturation")
fig.tight_layout()
fig.savefig(os.path.join(out, "veth.png"), dpi=110)
print(f"\nwrote {out}/veth.json, {out}/veth.md, {out}/veth.png")
EOF
