# Shared by run.sh and tcp.sh: start and stop each switch between the veths swa and swb of the
# namespace $NS_SW. The caller sets NS_SW, TMP, METRICS, WASMSWITCH and defines in_sw().
# ---- switches ------------------------------------------------------------------------------
# WS_XDP_MODE (native), WS_POOL_FRAMES, WS_BATCH (switch.batch, default 64) and WS_AFXDP (extra
# keys of both ports' afxdp sections, e.g. "ring_size: 2048") change the daemon's config for
# experiments.
start_wasmswitch() { # mode [umem of port b] [batch]
  cat > "$TMP/ws.yaml" <<EOF
switch:
  mode: $1
  batch: ${3:-${WS_BATCH:-64}}
pool:
  frames: ${WS_POOL_FRAMES:-32768}
metrics:
  listen: $METRICS
workers:
  - cpu: 1
    idle: poll
ports:
  - name: a
    driver: afxdp
    afxdp: { interface: swa, mode: ${WS_XDP_MODE:-native}, bind: copy${WS_AFXDP:+, $WS_AFXDP} }
  - name: b
    driver: afxdp${2:+
    umem: $2}
    afxdp: { interface: swb, mode: ${WS_XDP_MODE:-native}, bind: copy${WS_AFXDP:+, $WS_AFXDP} }
EOF
  # Not through a shell function: `ip netns exec` and `taskset` exec, so $! is the daemon.
  ip netns exec "$NS_SW" taskset -c 1 "$WASMSWITCH" run -c "$TMP/ws.yaml" >"$TMP/ws.log" 2>&1 &
  SW_PID=$!
  for _ in $(seq 100); do
    in_sw curl -sf "http://$METRICS/metrics" >/dev/null 2>&1 && return 0
    kill -0 $SW_PID 2>/dev/null || break
    sleep 0.1
  done
  cat "$TMP/ws.log" >&2; echo "wasmswitch did not start" >&2; return 1
}

OVS_DIR=$TMP/ovs
ovs() { OVS_RUNDIR=$OVS_DIR OVS_LOGDIR=$OVS_DIR OVS_DBDIR=$OVS_DIR "$@"; }
vsctl() { ovs ovs-vsctl --db=unix:$OVS_DIR/db.sock --timeout=20 "$@"; }
appctl() { ovs ovs-appctl -t "$OVS_DIR/vswitchd.ctl" "$@"; }
start_ovs() {
  mkdir -p "$OVS_DIR"
  ovs ovsdb-tool create "$OVS_DIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema
  ovs ovsdb-server "$OVS_DIR/conf.db" --remote=punix:$OVS_DIR/db.sock --unixctl=$OVS_DIR/ovsdb.ctl \
    --pidfile=$OVS_DIR/ovsdb-server.pid --log-file=$OVS_DIR/ovsdb.log -vconsole:off --detach
  vsctl --no-wait init
  vsctl --no-wait set Open_vSwitch . other_config:pmd-cpu-mask=0x2
  in_sw taskset -c 1 env OVS_RUNDIR=$OVS_DIR OVS_LOGDIR=$OVS_DIR OVS_DBDIR=$OVS_DIR \
    ovs-vswitchd unix:$OVS_DIR/db.sock --unixctl=$OVS_DIR/vswitchd.ctl \
    --pidfile=$OVS_DIR/ovs-vswitchd.pid --log-file=$OVS_DIR/vswitchd.log -vconsole:off --detach
  vsctl add-br br0 -- set bridge br0 datapath_type=netdev
  vsctl add-port br0 swa -- set interface swa type=afxdp options:xdp-mode=native
  vsctl add-port br0 swb -- set interface swb type=afxdp options:xdp-mode=native
  for _ in $(seq 100); do
    appctl dpif-netdev/pmd-rxq-show 2>/dev/null | grep -q "port: swb" && { sleep 1; return 0; }
    sleep 0.1
  done
  appctl dpif-netdev/pmd-rxq-show >&2 || true; tail -20 "$OVS_DIR/vswitchd.log" >&2; return 1
}
stop_ovs() {
  [ -d "$OVS_DIR" ] || return 0
  vsctl --if-exists del-br br0 >/dev/null 2>&1 || true
  for p in ovs-vswitchd ovsdb-server; do
    [ -f "$OVS_DIR/$p.pid" ] && kill "$(cat "$OVS_DIR/$p.pid")" 2>/dev/null
  done
  sleep 0.5
  for p in ovs-vswitchd ovsdb-server; do
    [ -f "$OVS_DIR/$p.pid" ] && kill -9 "$(cat "$OVS_DIR/$p.pid")" 2>/dev/null
  done
  rm -rf "$OVS_DIR"
}

start_bridge() {
  ip -n "$NS_SW" link add br0 type bridge
  ip -n "$NS_SW" link set swa master br0
  ip -n "$NS_SW" link set swb master br0
  ip -n "$NS_SW" link set br0 up
  # Softirq work follows the CPU that sends; steer the bridge's receive path to CPU 1.
  in_sw sh -c 'echo 2 > /sys/class/net/swa/queues/rx-0/rps_cpus; echo 2 > /sys/class/net/swb/queues/rx-0/rps_cpus'
  sleep 0.5
}
stop_bridge() {
  ip -n "$NS_SW" link del br0 2>/dev/null || true
  in_sw sh -c 'echo 0 > /sys/class/net/swa/queues/rx-0/rps_cpus; echo 0 > /sys/class/net/swb/queues/rx-0/rps_cpus' 2>/dev/null || true
}

CUR=""
start_switch() {
  CUR=$1
  case $1 in
    ws-cross) start_wasmswitch cross ;;
    ws-l2) start_wasmswitch l2 ;;
    # Port b in a second copy-mode UMEM (standing in for a zero-copy NIC's): every frame copied.
    ws-l2-2umem) start_wasmswitch l2 second ;;
    ws-l2-b256) start_wasmswitch l2 "" 256 ;;
    ovs) start_ovs ;;
    bridge) start_bridge ;;
  esac
}
stop_switch() {
  case $CUR in
    ws-*)
      if [ -n "$SW_PID" ]; then
        kill -TERM $SW_PID 2>/dev/null
        for _ in $(seq 100); do kill -0 $SW_PID 2>/dev/null || break; sleep 0.1; done
        kill -0 $SW_PID 2>/dev/null && { log "wasmswitch did not drain in 10 s; killing it"; kill -KILL $SW_PID; }
        wait $SW_PID 2>/dev/null || true
        grep -q "stopped cleanly" "$TMP/ws.log" || { log "wasmswitch log:"; tail -5 "$TMP/ws.log" >&2; }
        SW_PID=""
      fi ;;
    ovs) stop_ovs ;;
    bridge) stop_bridge ;;
  esac
  CUR=""
  sleep 0.3
}

