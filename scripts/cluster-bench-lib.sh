# shellcheck shell=bash
# Shared by scripts/bench-cluster and scripts/bench-ab (sourced, not run): a 3-node quorate
# cluster on loopback pinned to CPU 0, and the counters both read.
#
# Ports: RESP 16481-16483, HTTP 18481-18483, peer 17481-17483 (`use_ports 10` moves them
# all up by 10, for a second cluster beside the first).

# use_ports OFFSET: the ports start_nodes, counters and the callers use from now on.
use_ports() {
  local o=$1
  RESP=($((16481 + o)) $((16482 + o)) $((16483 + o)))
  HTTP=($((18481 + o)) $((18482 + o)) $((18483 + o)))
  PEER=($((17481 + o)) $((17482 + o)) $((17483 + o)))
}
use_ports 0
NODE_PIDS=()

# write_policies FILE: the policy file both scripts run. CL.THROTTLE key 15 30 60 is an inline
# GCRA limit, strict (the default); the fast runs use the same limit by name, `fast_gcra`,
# answered by the leader before commit; `strict_gcra` is it by name, strict (for QR.CHECK
# with request ids, which CL.THROTTLE does not take).
write_policies() {
  cat > "$1" <<'TOML'
[limits.fast_gcra]
algorithm = "gcra"
limit = 30
period = "60s"
burst = 16
consistency = "fast"

[limits.strict_gcra]
algorithm = "gcra"
limit = 30
period = "60s"
burst = 16

[inline]
allow = true
TOML
}

# Fails if something already listens on any of the given ports.
ports_free() {
  local p
  for p in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "port $p is in use; stop what listens there first" >&2
      return 1
    fi
  done
}

# start_nodes BIN DIR POLICIES [NAME=VALUE...]: starts the three members on CPU 0 (data and
# logs under DIR, node-N and node-N.log), sets NODE_PIDS, and returns once every node
# answers and the leaders have settled one per preferred node (shard g is led by member g
# mod 3; the rebalance loop moves them there every few seconds), so no election happens
# during a measurement. The environment (QUORATE_* settings) passes through to the nodes,
# and the NAME=VALUE settings are added for these nodes only.
start_nodes() {
  local bin=$1 dir=$2 policies=$3 i
  local extra=("${@:4}")
  local peers="1=127.0.0.1:${PEER[0]},2=127.0.0.1:${PEER[1]},3=127.0.0.1:${PEER[2]}"
  export QUORATE_CLUSTER_SECRET="${QUORATE_CLUSTER_SECRET:-bench-secret-$$-$RANDOM-$RANDOM}"
  NODE_PIDS=()
  for i in 1 2 3; do
    env "${extra[@]}" taskset -c 0 "$bin" node --id $i --peers "$peers" --data-dir "$dir/node-$i" \
      --http-addr 127.0.0.1:${HTTP[i-1]} --resp-addr 127.0.0.1:${RESP[i-1]} \
      --policies "$policies" --log warn >"$dir/node-$i.log" 2>&1 &
    NODE_PIDS+=($!)
  done
  leaders_settled 90 "${NODE_PIDS[*]}" "${HTTP[@]}" || { tail -n 20 "$dir"/node-*.log >&2; return 1; }
}

# leaders_settled SECONDS "PID..." HTTP_PORT...: waits (up to SECONDS) until the nodes agree
# that shard g is led by member g mod 3 + 1 (the rebalance loop takes a shard back to its
# preferred member every few seconds after an election), and prints "leaders settled after
# T s (N checks): [...]" (1 check: they were settled already). Fails if a node process has
# exited or the time runs out.
leaders_settled() {
  python3 - "$@" <<'PY'
import json, os, sys, time, urllib.request
limit, pids, ports = float(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
start = time.time()
deadline, last, checks = start + limit, None, 0
while time.time() < deadline:
    checks += 1
    for pid in pids:  # a node that exited (bad flag, port taken) is a zombie of the script
        stat = f"/proc/{pid}/stat"
        if not os.path.exists(stat) or open(stat).read().split()[2] == "Z":
            print(f"node process {pid} exited", file=sys.stderr); sys.exit(1)
    try:
        leaders = []
        for p in ports:
            s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{p}/v1/admin/status", timeout=2))
            leaders.append([g.get("leader") for g in s["cluster"]["groups"]])
        last = leaders[0]
        if all(l == leaders[0] for l in leaders) and all(
                l == g % len(ports) + 1 for g, l in enumerate(leaders[0])):
            print(f"leaders settled after {time.time() - start:.1f} s ({checks} checks):",
                  leaders[0])
            sys.exit(0)
    except Exception as e:
        last = e
    time.sleep(0.5)
print("cluster did not settle:", last, file=sys.stderr); sys.exit(1)
PY
}

# Stops the members started by start_nodes and waits for them to exit (SIGKILL after 10 s).
stop_nodes() {
  local p i
  [ "${#NODE_PIDS[@]}" -gt 0 ] || return 0
  kill "${NODE_PIDS[@]}" 2>/dev/null || true
  for p in "${NODE_PIDS[@]}"; do
    for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  NODE_PIDS=()
}

# counters HTTP_PORT...: sums over the given nodes: WAL syncs, WAL appends, decisions, Raft
# entries proposed, Raft terms (every shard's, as each node sees it: a change between two
# readings means an election happened between them), and checks forwarded to another
# node's leader. The WAL and Raft gauges are refreshed
# once a second, hence the sleep before reading.
counters() {
  sleep 1.2
  for p in "$@"; do curl -s "http://127.0.0.1:$p/metrics"; done | awk '
    /^quorate_wal_syncs /   { s += $2 }
    /^quorate_wal_appends / { a += $2 }
    /^quorate_decisions_total\{/ { d += $2 }
    /^quorate_raft_entries_proposed\{/ { e += $2 }
    /^quorate_raft_term\{/ { t += $2 }
    /^quorate_forwarded_checks_total / { f += $2 }
    END { printf "%d %d %d %d %d %d\n", s, a, d, e, t, f }'
}

# CPU time (user + system, clock ticks) the given processes have used, threads included.
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }

# Clock ticks the hypervisor has taken from this machine (all cores): a run during which
# this grows was slowed by the host, not by the code.
steal() { awk '/^cpu /{print $9}' /proc/stat; }
