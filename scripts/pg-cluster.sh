#!/usr/bin/env bash
# A local PostgreSQL cluster for the failover work (issue 30): etcd, three PostgreSQL 15 nodes under
# Patroni on their own ports and data directories, and HAProxy in front routing to the primary
# through Patroni's REST health check. From Debian's packages, installed when missing.
#
#   scripts/pg-cluster.sh up [--sync]   start it (synchronous_mode with --sync); prints the URL
#   scripts/pg-cluster.sh status        the members, their roles and lag (patronictl list)
#   scripts/pg-cluster.sh primary       the name of the current primary
#   scripts/pg-cluster.sh kill-primary [postgres|patroni|node]
#                                       SIGKILL the primary's PostgreSQL (default: its Patroni restarts
#                                       it in place), its Patroni (its leader key lapses after 10 s and
#                                       a standby is promoted; the old PostgreSQL runs on, fenced off by
#                                       the proxy's health check), or both (a lost node)
#   scripts/pg-cluster.sh revive        restart the Patroni of every node whose Patroni is gone (it
#                                       rejoins as a replica, rewound) and wait for three members
#   scripts/pg-cluster.sh mode [sync|async]
#                                       switch synchronous_mode on the running cluster (prints it)
#   scripts/pg-cluster.sh down          stop everything and remove the cluster's directory
#
# The proxy listens on 127.0.0.1:55430 (postgres://postgres@127.0.0.1:55430/postgres), the nodes
# on 55431-55433, Patroni's REST API on 58001-58003, etcd on 23790. Everything lives in
# ${IDEM_PG_CLUSTER_DIR:-/tmp/idem-pg-cluster}; PostgreSQL runs as the `postgres` user (it refuses
# root). .ci/run starts it (synchronous) for the failover test `reliability::reliability_failover`
# and stops it after.
set -euo pipefail
name=pg-cluster
# shellcheck source=scripts/cluster-lib.sh
source "$(dirname "$0")/cluster-lib.sh"

dir="${IDEM_PG_CLUSTER_DIR:-/tmp/idem-pg-cluster}"
bin_dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
proxy_port=55430
nodes=(node1 node2 node3)
pg_port() { echo $((55430 + ${1#node})); }
rest_port() { echo $((58000 + ${1#node})); }
url="postgres://postgres@127.0.0.1:${proxy_port}/postgres"

as_postgres() { runuser -u postgres -- "$@"; }

install() {
    local missing=()
    command -v patroni >/dev/null || missing+=(patroni)
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v haproxy >/dev/null || missing+=(haproxy)
    if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi
    [ -n "$bin_dir" ] || { echo "pg-cluster: no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }
}

role_of() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(rest_port "$1")/$2"; }
is_role() { [ "$(role_of "$1" "$2")" = 200 ]; }

primary() {
    for node in "${nodes[@]}"; do
        if is_role "$node" primary; then echo "$node"; return 0; fi
    done
    return 1
}

node_config() { # node_config NODE SYNC
    local node=$1 sync=$2
    cat <<EOF
scope: idem
namespace: /idem/
name: $node
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$(rest_port "$node")
  connect_address: 127.0.0.1:$(rest_port "$node")
etcd3:
  hosts: 127.0.0.1:23790
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    synchronous_mode: $sync
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_log_hints: "on"
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$(pg_port "$node")
  connect_address: 127.0.0.1:$(pg_port "$node")
  data_dir: $dir/$node/data
  bin_dir: $bin_dir
  pgpass: $dir/$node/pgpass
  authentication:
    replication:
      username: replicator
      password: replicator
    superuser:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: $dir/$node
EOF
}

haproxy_config() {
    cat <<EOF
global
    maxconn 200
defaults
    mode tcp
    timeout connect 4s
    timeout client 30m
    timeout server 30m
    timeout check 2s
listen primary
    bind 127.0.0.1:$proxy_port
    option httpchk OPTIONS /primary
    http-check expect status 200
    default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
EOF
    for node in "${nodes[@]}"; do
        echo "    server $node 127.0.0.1:$(pg_port "$node") maxconn 100 check port $(rest_port "$node")"
    done
}

up() {
    local sync=false
    [ "${1:-}" = "--sync" ] && sync=true
    install
    if [ -d "$dir" ]; then down; fi
    mkdir -p "$dir/etcd"
    etcd --name idem --data-dir "$dir/etcd" \
        --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
        --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
        --initial-cluster idem=http://127.0.0.1:23800 >"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"
    wait_for 20 "etcd answering" curl -sf http://127.0.0.1:23790/health
    for node in "${nodes[@]}"; do
        mkdir -p "$dir/$node"
        node_config "$node" "$sync" >"$dir/$node.yml"
        chown -R postgres: "$dir/$node" "$dir/$node.yml"
        chmod 700 "$dir/$node"
        start_patroni "$node"
        # The first node bootstraps the cluster; the others clone it once it is primary.
        if [ "$node" = node1 ]; then wait_for 60 "a primary" primary; fi
    done
    haproxy_config >"$dir/haproxy.cfg"
    haproxy -f "$dir/haproxy.cfg" -D -p "$dir/haproxy.pid"
    for node in node2 node3; do
        wait_for 60 "$node replicating" is_role "$node" replica
    done
    wait_for 20 "the proxy reaching the primary" psql "$url" -qAtc "SELECT 1"
    echo "pg-cluster: up (synchronous_mode: $sync); primary $(primary); $url"
}

status() {
    patronictl -c "$dir/node1.yml" list 2>/dev/null || echo "pg-cluster: not running"
}

kill_primary() {
    local what="${1:-postgres}" node
    node="$(primary)" || { echo "pg-cluster: no primary" >&2; exit 1; }
    case "$what" in
        postgres) kill -9 "$(head -1 "$dir/$node/data/postmaster.pid")" ;;
        patroni) pkill -9 -f "patroni $dir/$node.yml" ;;
        node)
            pkill -9 -f "patroni $dir/$node.yml"
            kill -9 "$(head -1 "$dir/$node/data/postmaster.pid")"
            ;;
        *) echo "pg-cluster: kill-primary postgres|patroni|node" >&2; exit 2 ;;
    esac
    echo "$node"
}

start_patroni() { # start_patroni NODE
    as_postgres patroni "$dir/$1.yml" >>"$dir/$1.log" 2>&1 &
}

revive() {
    for node in "${nodes[@]}"; do
        if ! pgrep -f "patroni $dir/$node.yml" >/dev/null; then start_patroni "$node"; fi
    done
    for node in "${nodes[@]}"; do
        wait_for 90 "$node running" is_role "$node" health
    done
    wait_for 30 "a primary" primary
    wait_for 20 "the proxy reaching the primary" psql "$url" -qAtc "SELECT 1"
}

mode() {
    case "${1:-}" in
        sync) patronictl -c "$dir/node1.yml" edit-config --force -s synchronous_mode=true >/dev/null ;;
        async) patronictl -c "$dir/node1.yml" edit-config --force -s synchronous_mode=false >/dev/null ;;
        "") ;;
        *) echo "pg-cluster: mode sync|async" >&2; exit 2 ;;
    esac
    if [ "${1:-}" = sync ]; then
        wait_for 30 "a synchronous standby" sh -c "patronictl -c '$dir/node1.yml' list | grep -q 'Sync Standby'"
    fi
    patronictl -c "$dir/node1.yml" show-config 2>/dev/null | grep -q 'synchronous_mode: true' && echo sync || echo async
}

down() {
    [ -d "$dir" ] || return 0
    [ -f "$dir/haproxy.pid" ] && kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
    # Patroni (run through runuser: found by its config) and any PostgreSQL it leaves behind.
    pkill -f "patroni $dir/" 2>/dev/null || true
    sleep 1
    pkill -9 -f "patroni $dir/" 2>/dev/null || true
    pkill -9 -f "postgres -D $dir/" 2>/dev/null || true
    [ -f "$dir/etcd.pid" ] && kill "$(cat "$dir/etcd.pid")" 2>/dev/null || true
    sleep 0.5
    rm -rf "$dir"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    status) status ;;
    primary) primary ;;
    kill-primary) shift; kill_primary "$@" ;;
    revive) revive; echo "pg-cluster: three members; primary $(primary)" ;;
    mode) shift; mode "$@" ;;
    down) down; echo "pg-cluster: down" ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
esac
