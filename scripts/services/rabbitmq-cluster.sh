#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, beside the default single node, for
# the failover tests (issue 30). Not part of scripts/test.sh or CI.
#
#   scripts/services/rabbitmq-cluster.sh start          # starts and clusters the nodes (idempotent)
#   scripts/services/rabbitmq-cluster.sh stop           # stops the three nodes
#   scripts/services/rabbitmq-cluster.sh ports          # prints their AMQP ports, one a line
#   scripts/services/rabbitmq-cluster.sh stop-node N    # stops node N (1, 2 or 3)
#   scripts/services/rabbitmq-cluster.sh start-node N   # starts node N again, and waits for it
#
# Running the cluster tests:
#
#   bash scripts/services/rabbitmq-cluster.sh start && \
#       CONVEYOR_RABBITMQ_CLUSTER=1 cargo test -p conveyor-lapin --test cluster
#
# The nodes are conveyor-c1@localhost, conveyor-c2@localhost and conveyor-c3@localhost,
# listening for AMQP on 127.0.0.1:5681, 5682 and 5683 (guest/guest, from loopback
# only), with Erlang distribution on 25681..25683. Each has its own config file, data
# and logs under /var/lib/conveyor-rabbit-cluster/<node>, and no plugins. They run as
# the `rabbitmq` user with its home, /var/lib/rabbitmq, so they share its Erlang cookie
# (and the CLI tools run the same way, so they share it too). Nodes 2 and 3 are joined
# to node 1. The default node (rabbit@localhost on 5672/5671, /etc/rabbitmq) is left
# alone: nothing here reads or writes its config, data or ports.
#
# Debian's `rabbitmq-server` package (3.10.8 on bookworm) is installed with apt-get
# when missing. Every wait is on a condition, with a deadline.
set -euo pipefail

BASE=/var/lib/conveyor-rabbit-cluster
NODES=(conveyor-c1 conveyor-c2 conveyor-c3)
AMQP_PORTS=(5681 5682 5683)
DIST_PORTS=(25681 25682 25683)
# How long a node may take to boot, or to stop, in seconds.
BOOT_DEADLINE=120
STOP_DEADLINE=60

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Runs `env [VAR=value...] command [args...]` as the rabbitmq user, with its home (and
# so its Erlang cookie). The RabbitMQ scripts are called from /usr/lib/rabbitmq/bin,
# bypassing Debian's wrapper, which would send every node's startup output to the
# default node's log files.
as_rabbit() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq "$@"
    else
        sudo -u rabbitmq env HOME=/var/lib/rabbitmq "$@"
    fi
}

# Runs a CLI tool against node index $1 (0-based): ctl <i> <tool> args...
ctl() {
    local i=$1 tool=$2
    shift 2
    as_rabbit "/usr/lib/rabbitmq/bin/$tool" -q -n "${NODES[$i]}@localhost" "$@"
}

install_if_missing() {
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        echo "rabbitmq-cluster: installing rabbitmq-server"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server
    fi
}

# Writes node i's config and makes its directories (rewritten each time: the content
# is fixed by this script).
prepare() {
    local i=$1 node=${NODES[$1]}
    local dir=$BASE/$node
    as_root install -d -m 0755 -o rabbitmq -g rabbitmq "$BASE" "$dir" "$dir/data" "$dir/log"
    as_root tee "$dir/rabbitmq.conf" >/dev/null <<EOF
# conveyor cluster node $node (scripts/services/rabbitmq-cluster.sh)
listeners.tcp.local = 127.0.0.1:${AMQP_PORTS[$i]}
listeners.ssl = none
loopback_users.guest = true
EOF
    echo "[]." | as_root tee "$dir/enabled_plugins" >/dev/null
    as_root chown rabbitmq:rabbitmq "$dir/rabbitmq.conf" "$dir/enabled_plugins"
}

running() {
    ctl "$1" rabbitmq-diagnostics check_running >/dev/null 2>&1
}

# Whether the node's Erlang VM answers at all (the app may be stopped).
reachable() {
    ctl "$1" rabbitmq-diagnostics ping >/dev/null 2>&1
}

# Waits until `$2 $1` succeeds, for at most $3 seconds.
await() {
    local i=$1 condition=$2 deadline=$((SECONDS + $3))
    until "$condition" "$i"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "rabbitmq-cluster: ${NODES[$i]}: not $condition after $3 s; see $BASE/${NODES[$i]}/log" >&2
            return 1
        fi
        sleep 1
    done
}

not_reachable() { ! reachable "$1"; }

start_node() {
    local i=$1 node=${NODES[$1]}
    local dir=$BASE/$node
    if running "$i"; then
        return
    fi
    prepare "$i"
    if reachable "$i"; then
        # The VM is up with the app stopped (a join interrupted, say).
        ctl "$i" rabbitmqctl start_app
    else
        echo "rabbitmq-cluster: starting $node on 127.0.0.1:${AMQP_PORTS[$i]}"
        as_rabbit \
            RABBITMQ_NODENAME="$node@localhost" \
            RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
            RABBITMQ_NODE_PORT="${AMQP_PORTS[$i]}" \
            RABBITMQ_DIST_PORT="${DIST_PORTS[$i]}" \
            RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
            RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
            RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
            RABBITMQ_MNESIA_BASE="$dir/data" \
            RABBITMQ_MNESIA_DIR="$dir/data/$node" \
            RABBITMQ_LOG_BASE="$dir/log" \
            RABBITMQ_PID_FILE="$dir/$node.pid" \
            RABBITMQ_PLUGINS_EXPAND_DIR="$dir/plugins-expand" \
            RABBITMQ_FEATURE_FLAGS_FILE="$dir/feature_flags" \
            RABBITMQ_QUORUM_DIR="$dir/data/$node/quorum" \
            /usr/lib/rabbitmq/bin/rabbitmq-server -detached
    fi
    await "$i" running "$BOOT_DEADLINE"
}

# Whether node i (1 or 2) is clustered with node 1 (index 0).
clustered() {
    ctl "$1" rabbitmqctl cluster_status --formatter json 2>/dev/null \
        | grep -q "\"${NODES[0]}@localhost\""
}

join() {
    local i=$1
    if clustered "$i"; then
        return
    fi
    echo "rabbitmq-cluster: joining ${NODES[$i]} to ${NODES[0]}"
    ctl "$i" rabbitmqctl stop_app
    ctl "$i" rabbitmqctl join_cluster "${NODES[0]}@localhost"
    ctl "$i" rabbitmqctl start_app
    await "$i" running "$BOOT_DEADLINE"
}

stop_node() {
    local i=$1
    if reachable "$i"; then
        echo "rabbitmq-cluster: stopping ${NODES[$i]}"
        ctl "$i" rabbitmqctl stop || true
    fi
    await "$i" not_reachable "$STOP_DEADLINE"
}

index_of() {
    case "${1:-}" in
        1 | 2 | 3) echo $(($1 - 1)) ;;
        *)
            echo "rabbitmq-cluster: a node number is 1, 2 or 3, not '${1:-}'" >&2
            exit 2
            ;;
    esac
}

case "${1:-}" in
    start)
        install_if_missing
        started=$SECONDS
        # The three boot together: a clustered node that restarts waits for the peers
        # it last saw running, so starting them one after the other could wait for a
        # node not started yet. A fresh node boots on its own and is joined below.
        for i in 0 1 2; do start_node "$i" & done
        wait
        for i in 0 1 2; do
            running "$i" || { echo "rabbitmq-cluster: ${NODES[$i]} did not start" >&2; exit 1; }
        done
        join 1
        join 2
        echo "rabbitmq-cluster: ready in $((SECONDS - started)) s: AMQP on 127.0.0.1:${AMQP_PORTS[*]}"
        ;;
    stop)
        for i in 0 1 2; do stop_node "$i" & done
        wait
        echo "rabbitmq-cluster: stopped"
        ;;
    ports)
        printf '%s\n' "${AMQP_PORTS[@]}"
        ;;
    stop-node)
        stop_node "$(index_of "${2:-}")"
        ;;
    start-node)
        i=$(index_of "${2:-}")
        start_node "$i"
        ;;
    *)
        echo "usage: $0 start|stop|ports|stop-node N|start-node N" >&2
        exit 2
        ;;
esac
