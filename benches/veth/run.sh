#!/usr/bin/env bash
# veth topology benchmark: gen-ns --veth--> switch-ns --veth--> sink-ns, 64-byte UDP.
#
#   sudo benches/veth/run.sh [--quick] [--runs N] [--out DIR] [--only LIST] [--perf]
#
# Switches compared in one invocation, same generator, same topology, same CPUs:
#   ws-cross   wasmswitch daemon, `switch.mode: cross` (port i -> port i^1, no parse/lookup:
#              the two-port equivalent of `passthrough`, which would send frames back out of
#              the ingress port), AF_XDP native + copy on the switch-side veth ends
#   ws-l2      wasmswitch daemon, `switch.mode: l2` (parse, learn, FDB lookup)
#   ws-l2-b256 (only with --only) ws-l2 with `switch.batch: 256` (64 otherwise)
#   ws-l2-2umem  (only with --only) ws-l2 with port b in a second UMEM group: every frame is
#              copied between the groups, as between a zero-copy NIC and a copy-mode veth
#   ovs        Open vSwitch userspace datapath (netdev), type=afxdp ports, xdp-mode=native, NORMAL
#   bridge     Linux bridge (br_netfilter active as on this machine), RPS steers it to CPU 1
#
# The generator (benches/gen, AF_XDP TX in copy mode, no XDP program) is pinned to CPU 0, the
# switching work to CPU 1. Delivered = rx_packets of the sink veth (the sink has no address and
# the frames' destination MAC is not its own, so its stack drops them right away).
#
# Phases: (1) saturation: generator at max rate; (2) the same offered load for every switch
# (98% of the lowest saturation offer of the first run's phase 1); (3) a short binary search for
# the highest rate with loss <= ZL_TOL (default 0.01%), each step tried STEP_REPEATS times
# (default 2) and passed only if every try was within it. The phases run --runs N times
# (default 3), the switches interleaved in each run; the table gives each figure's median over
# the runs and its spread, (max - min) / median.
# Writes $OUT/veth.json and $OUT/veth.png, prints a table. Everything it creates (namespaces,
# veths, OVS processes and database, temp files) is removed on exit, Ctrl-C or error.
#
# Environment: WASMSWITCH, WASMSWITCH_GEN (binaries; default target/release/...),
# ZL_TOL (loss fraction counted as zero loss), STEP_REPEATS, NO_INSTALL=1 (skip apt-get).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/bench-results
QUICK=0
ONLY="ws-cross,ws-l2,ovs,bridge"
PERF=0
RUNS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --runs) RUNS=$2; shift ;;
    --out) OUT=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --perf) PERF=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
[[ "$RUNS" =~ ^[1-9][0-9]?$ ]] || { echo "--runs $RUNS: expected 1-99" >&2; exit 2; }
STEP_REPEATS=${STEP_REPEATS:-2}
[[ "$STEP_REPEATS" =~ ^[1-9]$ ]] || { echo "STEP_REPEATS=$STEP_REPEATS: expected 1-9" >&2; exit 2; }
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
for sw in "${SWITCHES[@]}"; do
  case $sw in ws-cross|ws-l2|ws-l2-b256|ws-l2-2umem|ovs|bridge) ;; *) echo "--only: unknown switch $sw (ws-cross, ws-l2, ws-l2-b256, ws-l2-2umem, ovs, bridge)" >&2; exit 2 ;; esac
done
log "switches: ${SWITCHES[*]}; TSC $(printf %.0f "$TSC_HZ") Hz; quick=$QUICK; runs=$RUNS; search step repeats=$STEP_REPEATS"
declare -A SAT LOAD BS
RESULTS=$TMP/results.jsonl
: > "$RESULTS"
COMMON=""

for run in $(seq "$RUNS"); do
  for sw in "${SWITCHES[@]}"; do
    log "run $run/$RUNS, $sw: saturation (${SAT_S}s at max)"
    start_switch "$sw"
    SAT[$sw]=$(trial max $SAT_S)
    log "  $(jq -c '{offered_pps, delivered_pps, loss, cycles_per_pkt}' <<<"${SAT[$sw]}")"
    if [ $PERF = 1 ] && [ "$sw" = ws-l2 ] && [ "$run" = 1 ]; then
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

  # The same offered load for all, in every run: a little under the first run's lowest
  # saturation offer.
  if [ -z "$COMMON" ]; then
    COMMON=$(for sw in "${SWITCHES[@]}"; do field "${SAT[$sw]}" offered_pps; done | sort -g | head -1)
    COMMON=$($PY -c "print(int(float('$COMMON') * 0.98 / 1000) * 1000)")
    log "common offered load: $COMMON pps"
  fi

  for sw in "${SWITCHES[@]}"; do
    start_switch "$sw"
    log "run $run/$RUNS, $sw: ${LOAD_S}s at $COMMON pps"
    LOAD[$sw]=$(trial "$COMMON" $LOAD_S)
    log "  $(jq -c '{offered_pps, delivered_pps, loss, cycles_per_pkt}' <<<"${LOAD[$sw]}")"
    # Binary search for the highest rate with loss <= ZL_TOL, between 40% and 102% of the
    # saturation delivery. A step passes only if each of its STEP_REPEATS tries does; it
    # counts the lowest rate its tries offered.
    sat_del=$(field "${SAT[$sw]}" delivered_pps)
    lo=$($PY -c "print(int(float('$sat_del') * 0.4))"); hi=$($PY -c "print(int(float('$sat_del') * 1.02))")
    best=0; steps=""
    for _ in $(seq $BS_STEPS); do
      mid=$(( (lo + hi) / 2 ))
      pass=1; offered=""; losses=""
      for _ in $(seq "$STEP_REPEATS"); do
        t=$(trial $mid $BS_S)
        loss=$(field "$t" loss)
        losses="$losses $(printf %.5f "$loss")"
        offered="$offered $(field "$t" offered_pps)"
        steps="$steps$(jq -c '{target: (.target|tonumber), offered_pps, delivered_pps, loss}' <<<"$t"),"
        $PY -c "import sys; sys.exit(0 if float('$loss') <= $ZL_TOL else 1)" || { pass=0; break; }
      done
      if [ $pass = 1 ]; then
        lo=$mid; best=$(tr ' ' '\n' <<<"$offered" | grep . | sort -g | head -1)
      else
        hi=$mid
      fi
      log "  search: $mid pps -> loss$losses"
    done
    BS[$sw]="{\"zero_loss_pps\": $best, \"steps\": [${steps%,}]}"
    stop_switch
    jq -c --arg sw "$sw" --argjson run "$run" -n --argjson sat "${SAT[$sw]}" --argjson load "${LOAD[$sw]}" --argjson bs "${BS[$sw]}" \
      '{switch: $sw, run: $run, saturation: $sat, common_load: $load, search: $bs}' >> "$RESULTS"
  done
done

# ---- report --------------------------------------------------------------------------------
$PY - "$RESULTS" "$OUT" "$COMMON" "$ZL_TOL" "$QUICK" "$TSC_HZ" "$BG_BUSY" "$RUNS" <<'EOF'
import json, sys, os, platform, datetime, statistics
res_path, out, common, tol, quick, tsc, bg, runs = sys.argv[1:]
rows = [json.loads(l) for l in open(res_path)]
names = {"ws-cross": "wasmswitch cross", "ws-l2": "wasmswitch l2", "ws-l2-b256": "wasmswitch l2, batch 256", "ws-l2-2umem": "wasmswitch l2, 2 UMEMs",
         "ovs": "OVS afxdp", "bridge": "Linux bridge"}
switches = list(dict.fromkeys(r["switch"] for r in rows))
# Each figure over the runs: median, spread = (max - min) / median, min, max; None if missing.
figures = {
    "sat_offered_pps": lambda r: r["saturation"]["offered_pps"],
    "sat_delivered_pps": lambda r: r["saturation"]["delivered_pps"],
    "sat_loss": lambda r: r["saturation"]["loss"],
    "sat_cycles_per_pkt": lambda r: r["saturation"]["cycles_per_pkt"],
    "load_delivered_pps": lambda r: r["common_load"]["delivered_pps"],
    "load_loss": lambda r: r["common_load"]["loss"],
    "load_cycles_per_pkt": lambda r: r["common_load"]["cycles_per_pkt"],
    "zero_loss_pps": lambda r: r["search"]["zero_loss_pps"] or None,
}
def stat(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return {"median": m, "spread": (max(vals) - min(vals)) / m if m else 0.0, "min": min(vals), "max": max(vals), "runs": vals}
summary = {sw: {f: stat([get(r) for r in rows if r["switch"] == sw]) for f, get in figures.items()} for sw in switches}
doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "kernel": platform.release(), "quick": quick == "1", "runs": int(runs), "tsc_hz": float(tsc),
       "common_offered_pps": int(common), "background_busy_before": float(bg), "zero_loss_tolerance": float(tol),
       "summary": summary, "results": rows}
json.dump(doc, open(os.path.join(out, "veth.json"), "w"), indent=1)

def med(sw, f):
    return (summary[sw][f] or {}).get("median")
def cell(sw, f, fmt):
    s = summary[sw][f]
    if s is None:
        return "-"
    if len(s["runs"]) < 2:
        return fmt(s["median"])
    # A loss is near zero: its worst run says more than a spread around a tiny median.
    if f.endswith("_loss"):
        return fmt(s["median"]) + f" (max {fmt(s['max'])})"
    return fmt(s["median"]) + f" ({s['spread']*100:.0f}%)"
k = lambda x: f"{x/1e3:.0f}"
c = lambda x: f"{x:.0f}"
l = lambda x: f"{x*100:.2f}%"
hdr = ("switch", "sat offered Kpps", "sat delivered Kpps", "sat loss", "sat cyc/pkt",
       f"@{int(common)//1000}K delivered Kpps", "loss", "cyc/pkt", "zero-loss Kpps")
lines = [f"median of {runs} run(s); in parentheses the spread, (max - min) / median (for a loss: the worst run)", "",
         "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
for sw in switches:
    lines.append("| " + " | ".join([names.get(sw, sw), cell(sw, "sat_offered_pps", k), cell(sw, "sat_delivered_pps", k),
        cell(sw, "sat_loss", l), cell(sw, "sat_cycles_per_pkt", c), cell(sw, "load_delivered_pps", k), cell(sw, "load_loss", l),
        cell(sw, "load_cycles_per_pkt", c), cell(sw, "zero_loss_pps", k)]) + " |")
def ratio(a, b):
    return "-" if not a or not b else f"{a/b:.3f}x"
lines.append("")
for other, what in (("ws-cross", "wasmswitch cross"), ("ovs", "OVS afxdp")):
    if "ws-l2" in summary and other in summary:
        for phase, p in (("saturation", "sat"), ("common_load", "load")):
            lines.append(f"wasmswitch l2 / {what} ({phase}, medians): delivered {ratio(med('ws-l2', p + '_delivered_pps'), med(other, p + '_delivered_pps'))}, "
                         f"cycles/pkt {ratio(med('ws-l2', p + '_cycles_per_pkt'), med(other, p + '_cycles_per_pkt'))}")
        lines.append(f"wasmswitch l2 / {what} (zero-loss rate, medians): {ratio(med('ws-l2', 'zero_loss_pps'), med(other, 'zero_loss_pps'))}")
if "ws-l2" in summary and "ws-l2-b256" in summary:
    for phase, p in (("saturation", "sat"), ("same load", "load")):
        lines.append(f"batch 256 / batch 64 ({phase}, medians): delivered {ratio(med('ws-l2-b256', p + '_delivered_pps'), med('ws-l2', p + '_delivered_pps'))}, "
                     f"cycles/pkt {ratio(med('ws-l2-b256', p + '_cycles_per_pkt'), med('ws-l2', p + '_cycles_per_pkt'))}")
    lines.append(f"batch 256 / batch 64 (zero-loss rate, medians): {ratio(med('ws-l2-b256', 'zero_loss_pps'), med('ws-l2', 'zero_loss_pps'))}")
if "ws-l2" in summary and "ws-l2-2umem" in summary:
    for phase, p in (("saturation", "sat"), ("common_load", "load")):
        lines.append(f"2 UMEMs / 1 UMEM ({phase}, medians): delivered {ratio(med('ws-l2-2umem', p + '_delivered_pps'), med('ws-l2', p + '_delivered_pps'))}, "
                     f"cycles/pkt {ratio(med('ws-l2-2umem', p + '_cycles_per_pkt'), med('ws-l2', p + '_cycles_per_pkt'))}")
    lines.append(f"2 UMEMs / 1 UMEM (zero-loss rate, medians): {ratio(med('ws-l2-2umem', 'zero_loss_pps'), med('ws-l2', 'zero_loss_pps'))}")
table = "\n".join(lines)
print(table)
open(os.path.join(out, "veth.md"), "w").write(table + "\n")

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
labels = [names.get(sw, sw) for sw in switches]
x = range(len(switches)); w = 0.27
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
def series(f, scale):
    meds, lo, hi = [], [], []
    for sw in switches:
        s = summary[sw][f] or {"median": 0, "min": 0, "max": 0}
        meds.append(s["median"] / scale); lo.append((s["median"] - s["min"]) / scale); hi.append((s["max"] - s["median"]) / scale)
    return meds, [lo, hi]
for off, f, lab in ((-w, "sat_delivered_pps", "delivered at saturation"), (0, "load_delivered_pps", f"delivered at {int(common)//1000} Kpps offered"),
                    (w, "zero_loss_pps", f"zero-loss rate (loss <= {float(tol)*100:g}%)")):
    vals, errs = series(f, 1e3)
    bars = ax1.bar([i + off for i in x], vals, w, yerr=errs, capsize=2, label=lab)
    ax1.bar_label(bars, fmt="%.0f", fontsize=7)
ax1.set_xticks(list(x), labels); ax1.set_ylabel(f"Kpps (64-byte frames), median of {runs}, min-max"); ax1.legend(fontsize=8, loc="lower left")
ax1.set_title("gen (CPU 0) -> veth -> switch (CPU 1) -> veth -> sink")
vals, errs = series("sat_cycles_per_pkt", 1)
bars = ax2.bar(list(x), vals, 0.5, yerr=errs, capsize=3, color="tab:gray")
ax2.bar_label(bars, fmt="%.0f", fontsize=8)
ax2.set_xticks(list(x), labels); ax2.set_ylabel("TSC cycles per packet (switching CPU)")
ax2.set_title("cycles per packet at saturation")
fig.tight_layout()
fig.savefig(os.path.join(out, "veth.png"), dpi=110)
print(f"\nwrote {out}/veth.json, {out}/veth.md, {out}/veth.png")
EOF
