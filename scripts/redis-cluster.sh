#!/usr/bin/env bash
# A local Redis Cluster for the Redis ledger (issue 31): three primaries and three replicas from
# Debian's `redis-server` in cluster mode (installed when missing), each on its own port and
# directory, with append-only persistence (fsync every write) and `noeviction`; a replica may
# always be promoted (`cluster-replica-validity-factor 0`), so a lost primary is replaced even
# when its replica lags — the setting under which acknowledged writes can be lost, measured.
#
#   scripts/redis-cluster.sh up           start it; prints the seed URL
#   scripts/redis-cluster.sh status       the nodes, their roles and slots (CLUSTER NODES)
#   scripts/redis-cluster.sh kill-primary [SLOT [LAG]]
#                                         SIGKILL the primary serving SLOT (default 0); its
#                                         replica is promoted (about 4 s here: node timeout 2 s).
#                                         With LAG (seconds), its replica is stopped and cut off
#                                         that long first and continued after the kill: a replica
#                                         that trails its primary by LAG when the primary dies
#   scripts/redis-cluster.sh revive       restart every node that is gone (it rejoins as a replica)
#   scripts/redis-cluster.sh down         stop everything and remove the cluster's directory
#
# Nodes listen on 127.0.0.1:7101-7106 (7101-7103 start as primaries); everything lives in
# ${IDEM_REDIS_CLUSTER_DIR:-/tmp/idem-redis-cluster}. `.ci/run` starts it before the tests (the
# Redis ledger's conformance suite and failover test) and stops it after. The ledger URL is
# redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 (any one node would do: the others
# are found from it).
set -euo pipefail
name=redis-cluster
# shellcheck source=scripts/cluster-lib.sh
source "$(dirname "$0")/cluster-lib.sh"

dir="${IDEM_REDIS_CLUSTER_DIR:-/tmp/idem-redis-cluster}"
ports=(7101 7102 7103 7104 7105 7106)
url="redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"

install() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        apt_install redis-server
    fi
}

start_node() { # start_node PORT
    local port=$1
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --daemonize yes \
        --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
        --cluster-replica-validity-factor 0 \
        --appendonly yes --appendfsync always --maxmemory-policy noeviction --save ""
}

# The port of a node that answers (any: each knows the whole cluster).
live() {
    for port in "${ports[@]}"; do
        if redis-cli -p "$port" ping >/dev/null 2>&1; then echo "$port"; return 0; fi
    done
    return 1
}

nodes() { redis-cli -p "$(live)" cluster nodes; }

cluster_ok() { redis-cli -p "$(live)" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }

three_replicas() { [ "$(nodes | awk '$3 ~ /slave/ && $8 == "connected"' | wc -l)" = 3 ]; }

# Every replica has finished its sync with its primary: a replica still loading would be promoted
# without the primary's records (`cluster-replica-validity-factor 0` allows it), which a test
# must not take for a loss of the ledger's.
replicas_synced() {
    local port info
    for port in "${ports[@]}"; do
        info="$(redis-cli -p "$port" info replication 2>/dev/null)" || return 1
        if grep -q '^role:slave' <<<"$info"; then
            grep -q '^master_link_status:up' <<<"$info" || return 1
            grep -q '^master_sync_in_progress:0' <<<"$info" || return 1
        fi
    done
}

up() {
    install
    if [ -d "$dir" ]; then down; fi
    mkdir -p "$dir"
    for port in "${ports[@]}"; do start_node "$port"; done
    for port in "${ports[@]}"; do wait_for 20 "node $port answering" redis-cli -p "$port" ping; done
    local nodes=()
    for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1
    wait_for 30 "the cluster settling" cluster_ok
    wait_for 30 "three replicas attached" three_replicas
    wait_for 30 "the replicas in sync" replicas_synced
    echo "redis-cluster: up (3 primaries, 3 replicas); $url"
}

status() {
    nodes 2>/dev/null || echo "redis-cluster: not running"
}

primary_of_slot() { # the port of the primary serving SLOT
    local slot=$1
    nodes | awk -v slot="$slot" '
        $3 ~ /master/ && $8 == "connected" {
            for (i = 9; i <= NF; i++) {
                n = split($i, r, "-");
                if ((n == 1 && r[1] == slot) || (n == 2 && slot >= r[1] && slot <= r[2])) {
                    split($2, a, "[:@]"); print a[2]; exit
                }
            }
        }'
}

replica_of() { # the port of a replica of the primary on PORT
    local port=$1 id
    id="$(nodes | awk -v port="$port" '{ split($2, a, "[:@]"); if (a[2] == port) print $1 }')"
    nodes | awk -v id="$id" '$3 ~ /slave/ && $4 == id { split($2, a, "[:@]"); print a[2]; exit }'
}

kill_primary() {
    local slot="${1:-0}" lag="${2:-0}" port replica=""
    port="$(primary_of_slot "$slot")"
    [ -n "$port" ] || { echo "redis-cluster: no primary serves slot $slot" >&2; exit 1; }
    if [ "$lag" != 0 ]; then
        # The replica stops (SIGSTOP) and the primary drops its replication link, so for LAG
        # seconds what the primary acknowledges reaches no other node (a stopped process alone
        # would not do: the kernel goes on buffering the stream for it); then the primary dies.
        replica="$(replica_of "$port")"
        [ -n "$replica" ] || { echo "redis-cluster: the primary on $port has no replica" >&2; exit 1; }
        kill -STOP "$(cat "$dir/$replica/redis.pid")"
        redis-cli -p "$port" client kill type replica >/dev/null
        sleep "$lag"
    fi
    kill -9 "$(cat "$dir/$port/redis.pid")"
    if [ -n "$replica" ]; then kill -CONT "$(cat "$dir/$replica/redis.pid")"; fi
    echo "$port"
}

revive() {
    for port in "${ports[@]}"; do
        if ! redis-cli -p "$port" ping >/dev/null 2>&1; then start_node "$port"; fi
    done
    for port in "${ports[@]}"; do wait_for 20 "node $port answering" redis-cli -p "$port" ping; done
    wait_for 30 "the cluster settling" cluster_ok
    wait_for 30 "three replicas attached" three_replicas
    wait_for 30 "the replicas in sync" replicas_synced
}

down() {
    [ -d "$dir" ] || return 0
    for port in "${ports[@]}"; do
        [ -f "$dir/$port/redis.pid" ] && kill "$(cat "$dir/$port/redis.pid")" 2>/dev/null || true
    done
    sleep 0.5
    for port in "${ports[@]}"; do
        [ -f "$dir/$port/redis.pid" ] && kill -9 "$(cat "$dir/$port/redis.pid")" 2>/dev/null || true
    done
    rm -rf "$dir"
}

case "${1:-}" in
    up) up ;;
    status) status ;;
    kill-primary) shift; kill_primary "$@" ;;
    revive) revive; echo "redis-cluster: every node up" ;;
    down) down; echo "redis-cluster: down" ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
esac
