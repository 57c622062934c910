#!/usr/bin/env bash
# Real traffic through each switch: iperf3 TCP (and UDP at a fixed rate) between two namespaces.
#
#   benches/veth/tcp.sh [--seconds N] [--runs N] [--only LIST] [--offload default,off] [--out DIR]
#                       [--udp-rate RATE] [--parallel N (TCP streams per run)]
#
# Topology: cli-ns (c0) --veth-- (swa) switch-ns (swb) --veth-- (s0) srv-ns, IPv4 and IPv6.
# Switches: ws-l2 (wasmswitch daemon, l2, AF_XDP on swa/swb, worker on CPU 1), ovs (OVS
# afxdp, PMD on CPU 1), bridge (Linux bridge, RPS to CPU 1). iperf3 client and server run on
# CPU 0. Offloads: `default` leaves every veth as the kernel made it (TX checksum offload on:
# senders hand over CHECKSUM_PARTIAL frames); `off` runs `ethtool -K c0/s0 tx off` first.
# Per run: TCP throughput and retransmitted segments (iperf3 -J, sender side), UDP loss at
# --udp-rate, and for wasmswitch every drop counter of /metrics that moved.
# Prints a table with the median and min-max of the runs; writes $OUT/tcp.json and tcp.md.
# Everything it creates is removed on exit (trap).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/bench-results
SECS=8
RUNS=3
ONLY="ws-l2,ovs,bridge"
OFFLOADS="default,off"
UDP_RATE=100M
PARALLEL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --offload) OFFLOADS=$2; shift ;;
    --udp-rate) UDP_RATE=$2; shift ;;
    --parallel) PARALLEL=$2; shift ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }

WASMSWITCH=${WASMSWITCH:-$ROOT/target/release/wasmswitch}
METRICS=127.0.0.1:19188
PY=/usr/bin/python3
log() { echo "[tcp] $*" >&2; }

need_pkgs=()
command -v iperf3 >/dev/null || need_pkgs+=(iperf3)
command -v ethtool >/dev/null || need_pkgs+=(ethtool)
command -v ovs-vswitchd >/dev/null || need_pkgs+=(openvswitch-switch)
command -v jq >/dev/null || need_pkgs+=(jq)
command -v curl >/dev/null || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ] && [ -z "${NO_INSTALL:-}" ]; then
  log "installing ${need_pkgs[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
if [[ ",$ONLY," == *,ws-l2,* ]] && [ ! -x "$WASMSWITCH" ]; then
  log "building wasmswitch (release)"
  (cd "$ROOT" && cargo build --release -p wasmswitch)
fi

PFX="wst$$"
NS_CLI=$PFX-cli NS_SW=$PFX-sw NS_SRV=$PFX-srv
TMP=$(mktemp -d /tmp/wasmswitch-tcp.XXXXXX)
SW_PID=""
cleanup() {
  set +e
  stop_switch 2>/dev/null
  [ -n "${IPERF_SRV:-}" ] && kill "$IPERF_SRV" 2>/dev/null
  for ns in $NS_CLI $NS_SW $NS_SRV; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
in_cli() { ip netns exec "$NS_CLI" "$@"; }
in_sw() { ip netns exec "$NS_SW" "$@"; }
in_srv() { ip netns exec "$NS_SRV" "$@"; }
# shellcheck source=lib.sh
. "$ROOT/benches/veth/lib.sh"

for ns in $NS_CLI $NS_SW $NS_SRV; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
ip link add c0 netns "$NS_CLI" type veth peer name swa netns "$NS_SW"
ip link add swb netns "$NS_SW" type veth peer name s0 netns "$NS_SRV"
in_sw sysctl -qw net.ipv6.conf.all.disable_ipv6=1
for l in "$NS_CLI c0 1" "$NS_SRV s0 2"; do
  set -- $l
  ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0
  ip -n "$1" addr add "10.88.0.$3/24" dev "$2"
  ip -n "$1" addr add "fd88::$3/64" dev "$2" nodad
  ip -n "$1" link set "$2" up
done
ip -n "$NS_SW" link set swa up
ip -n "$NS_SW" link set swb up

IPERF_SRV=""
in_srv taskset -c 0 iperf3 -s -D -I "$TMP/iperf.pid" >/dev/null
sleep 0.3
IPERF_SRV=$(cat "$TMP/iperf.pid")

set_offload() { # on|off
  in_cli ethtool -K c0 tx "$1" >/dev/null 2>&1
  in_srv ethtool -K s0 tx "$1" >/dev/null 2>&1
}

# Drop-like counters of the running wasmswitch, as "name{labels} value" lines.
ws_drops() {
  in_sw curl -sf "http://$METRICS/metrics" | grep -E '^wasmswitch_(port_drops|afxdp_kernel_rx|afxdp_tx_kernel_drops|afxdp_kernel_tx_invalid|port_interface_dropped|pool_alloc_empty|afxdp_fill_starved|port_checksums_completed)' || true
}

# iperf3 between the namespaces; prints one JSON object.
one_run() { # switch offload run
  local before="" after=""
  [ "${1%%-*}" = ws ] && before=$(ws_drops)
  in_cli timeout $((SECS + 15)) taskset -c 0 iperf3 -c 10.88.0.2 -P "$PARALLEL" -t "$SECS" -J --connect-timeout 3000 >"$TMP/tcp4" 2>/dev/null || true
  in_cli timeout $((SECS + 15)) taskset -c 0 iperf3 -c fd88::2 -P "$PARALLEL" -t "$SECS" -J --connect-timeout 3000 >"$TMP/tcp6" 2>/dev/null || true
  in_cli timeout 20 taskset -c 0 iperf3 -c 10.88.0.2 -u -b "$UDP_RATE" -l 1400 -t 3 -J --connect-timeout 3000 >"$TMP/udp4" 2>/dev/null || true
  [ "${1%%-*}" = ws ] && after=$(ws_drops)
  # The receiver's view of UDP: datagrams lost to a full socket buffer or a bad checksum.
  local rcv; rcv=$(in_srv nstat -saz UdpInDatagrams UdpRcvbufErrors UdpInCsumErrors UdpInErrors 2>/dev/null | awk 'NR>1 {printf "%s=%s ", $1, $2}')
  $PY - "$1" "$2" "$3" "$before" "$after" "$TMP" "$rcv" <<'EOF'
import json, sys
sw, off, run, before, after, tmp, rcv = sys.argv[1:]
raw = lambda n: open(f"{tmp}/{n}").read()
def tcp(raw):
    try:
        j = json.loads(raw)
        if "error" in j: return {"error": j["error"]}
        s = j["end"]["sum_sent"]
        return {"gbit_s": s["bits_per_second"] / 1e9, "retransmits": s.get("retransmits")}
    except Exception as e:
        return {"error": "no result (%s)" % type(e).__name__}
def udp(raw):
    try:
        j = json.loads(raw)
        if "error" in j: return {"error": j["error"]}
        s = j["end"]["sum"]
        return {"mbit_s": s["bits_per_second"] / 1e6, "lost_percent": s["lost_percent"], "lost": s["lost_packets"], "packets": s["packets"]}
    except Exception as e:
        return {"error": "no result (%s)" % type(e).__name__}
def counters(text):
    d = {}
    for line in text.splitlines():
        k, v = line.rsplit(" ", 1)
        d[k] = float(v)
    return d
b, a = counters(before), counters(after)
moved = {k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0) > 0}
print(json.dumps({"switch": sw, "offload": off, "run": int(run), "tcp4": tcp(raw("tcp4")), "tcp6": tcp(raw("tcp6")),
                  "udp4": udp(raw("udp4")), "switch_counters_moved": moved,
                  "receiver_udp_totals": dict(kv.split("=") for kv in rcv.split())}))
EOF
}

mkdir -p "$OUT"
RESULTS=$TMP/results.jsonl
: > "$RESULTS"
IFS=, read -r -a SWITCHES <<<"$ONLY"
IFS=, read -r -a OFFS <<<"$OFFLOADS"
log "switches: ${SWITCHES[*]}; offloads: ${OFFS[*]}; ${RUNS} runs of ${SECS}s TCP (IPv4 and IPv6) + 3s UDP at $UDP_RATE"
for sw in "${SWITCHES[@]}"; do
  start_switch "$sw"
  for off in "${OFFS[@]}"; do
    if [ "$off" = off ]; then set_offload off; else set_offload on; fi
    # Let every learning switch see both MACs before the clock starts.
    in_cli ping -c 2 -i 0.2 -W 1 10.88.0.2 >/dev/null 2>&1 || true
    in_cli ping -6 -c 2 -i 0.2 -W 1 fd88::2 >/dev/null 2>&1 || true
    for r in $(seq "$RUNS"); do
      row=$(one_run "$sw" "$off" "$r")
      echo "$row" >> "$RESULTS"
      log "$sw offload=$off run $r: $(jq -c '{tcp4, tcp6, udp4: (.udp4 | {lost_percent, error}), switch_counters_moved}' <<<"$row")"
    done
  done
  stop_switch
done

$PY - "$RESULTS" "$OUT" "$SECS" "$UDP_RATE" <<'EOF'
import json, sys, os, statistics, datetime, platform
res, out, secs, rate = sys.argv[1:]
rows = [json.loads(l) for l in open(res)]
names = {"ws-l2": "wasmswitch l2", "ovs": "OVS afxdp", "bridge": "Linux bridge"}
def med(xs):
    xs = [x for x in xs if x is not None]
    if not xs: return "fails"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"
def medi(xs):
    xs = [x for x in xs if x is not None]
    if not xs: return "-"
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"
groups = {}
for r in rows: groups.setdefault((r["switch"], r["offload"]), []).append(r)
hdr = ("switch", "offloads", "TCP/IPv4 Gbit/s", "retransmits", "TCP/IPv6 Gbit/s", "retransmits", f"UDP {rate} loss %", "runs failed")
lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
for (sw, off), rs in groups.items():
    g = lambda k, f: [r[k].get(f) for r in rs]
    failed = sum(1 for r in rs if "error" in r["tcp4"] or "error" in r["tcp6"] or "error" in r["udp4"])
    lines.append("| " + " | ".join([names.get(sw, sw), off, med(g("tcp4", "gbit_s")), medi(g("tcp4", "retransmits")),
        med(g("tcp6", "gbit_s")), medi(g("tcp6", "retransmits")), med(g("udp4", "lost_percent")), f"{failed}/{len(rs)}"]) + " |")
table = "\n".join(lines)
print(f"median (min-max) of {len(next(iter(groups.values())))} runs, {secs} s each")
print(table)
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "kernel": platform.release(),
           "seconds": int(secs), "udp_rate": rate, "results": rows}, open(os.path.join(out, "tcp.json"), "w"), indent=1)
open(os.path.join(out, "tcp.md"), "w").write(table + "\n")
EOF
