#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, beside the default single node, for
# the failover and partition tests (issue 30, crates/conveyor-lapin/tests/cluster.rs).
# scripts/test.sh (and so CI) starts it and runs those tests.
#
#   scripts/services/rabbitmq-cluster.sh start          # starts and clusters the nodes (idempotent; heals a partition left behind)
#   scripts/services/rabbitmq-cluster.sh stop           # heals, then stops the three nodes
#   scripts/services/rabbitmq-cluster.sh ports          # prints their AMQP ports, one a line
#   scripts/services/rabbitmq-cluster.sh stop-node N    # stops node N (1, 2 or 3)
#   scripts/services/rabbitmq-cluster.sh start-node N   # starts node N again, and waits for it
#   scripts/services/rabbitmq-cluster.sh partition N    # cuts node N off from the other two (iptables)
#   scripts/services/rabbitmq-cluster.sh heal           # removes every partition rule, waits for the cluster to be whole
#
# Running the cluster tests by hand:
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
# when missing, and `iptables` when `partition` first needs it. The partition rules live
# in a chain of their own (CONVEYOR-PARTITION) and touch only the cluster's distribution
# ports and source addresses, never the default node's. Each node's settings for
# partitions (pause_minority, net_ticktime, net_setuptime, its source address) are
# explained at `prepare`; a running node with other settings is restarted by `start`.
# Every wait is on a condition, with a deadline.
set -euo pipefail

BASE=/var/lib/conveyor-rabbit-cluster
NODES=(conveyor-c1 conveyor-c2 conveyor-c3)
AMQP_PORTS=(5681 5682 5683)
DIST_PORTS=(25681 25682 25683)
# How long a node may take to boot, or to stop, in seconds.
BOOT_DEADLINE=120
STOP_DEADLINE=60
# Seconds of silence after which a node takes a peer for down (see prepare).
NET_TICKTIME=3
# Seconds a node waits for a distribution connection to be set up (see prepare).
NET_SETUPTIME=2
# The iptables chain `partition` adds its rules to, jumped to from OUTPUT (loopback
# traffic passes OUTPUT once each way).
CHAIN=CONVEYOR-PARTITION

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
#
# - cluster_partition_handling = pause_minority: with three nodes, a node cut off from
#   the other two pauses (stops its listeners, closes its clients' connections) until
#   it sees them again, so clients fail over to the majority instead of hanging on a
#   node that can serve neither quorum queues nor consistent metadata; it resumes by
#   itself when the partition heals. (autoheal would keep both sides serving and
#   restart the losers afterwards; ignore would leave the split for a person.)
# - net_ticktime = NET_TICKTIME: a silent peer is taken for down after about that many
#   seconds (75 to 125 % of it) instead of the default 60, so a partition is detected,
#   and the minority paused, within the tests' 10 s. Low for a real network, and a
#   node stalled that long on a busy machine would be taken for partitioned.
# - net_setuptime = NET_SETUPTIME: how long a node waits for a distribution connection
#   to be set up (default 7 s). A call to a process on a cut-off node first tries to
#   connect to it, and with its packets dropped that waits the whole setup time: a
#   quorum queue's basic.consume on a majority node was seen to wait 6.7 s that way
#   right after a partition, before the member elected meanwhile answered.
# - inet_dist_connect_options {ip, 127.0.0.1N}: the node's outgoing distribution
#   connections come from an address of its own on loopback (its incoming ones go to
#   its own port), which is what lets `partition N` cut exactly node N's links.
prepare() {
    local i=$1 node=${NODES[$1]}
    local dir=$BASE/$node
    as_root install -d -m 0755 -o rabbitmq -g rabbitmq "$BASE" "$dir" "$dir/data" "$dir/log"
    as_root tee "$dir/rabbitmq.conf" >/dev/null <<EOF
# conveyor cluster node $node (scripts/services/rabbitmq-cluster.sh)
listeners.tcp.local = 127.0.0.1:${AMQP_PORTS[$i]}
listeners.ssl = none
loopback_users.guest = true
cluster_partition_handling = pause_minority
EOF
    as_root tee "$dir/advanced.config" >/dev/null <<EOF
%% conveyor cluster node $node (scripts/services/rabbitmq-cluster.sh)
[{kernel, [{net_ticktime, $NET_TICKTIME},
           {net_setuptime, $NET_SETUPTIME},
           {inet_dist_connect_options, [{ip, {$(source_ip "$i" | tr . ,)}}]}]}].
EOF
    echo "[]." | as_root tee "$dir/enabled_plugins" >/dev/null
    as_root chown rabbitmq:rabbitmq "$dir/rabbitmq.conf" "$dir/advanced.config" "$dir/enabled_plugins"
}

# The loopback address node i's outgoing distribution connections come from.
source_ip() {
    echo "127.0.0.$((11 + $1))"
}

# Whether running node i has this script's settings (a node started by an earlier
# version of it has not, and is restarted).
configured() {
    [ "$(ctl "$1" rabbitmqctl eval \
        '{net_kernel:get_net_ticktime(), application:get_env(kernel, net_setuptime)}.' \
        2>/dev/null)" = "{$NET_TICKTIME,{ok,$NET_SETUPTIME}}" ]
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
    if running "$i" && configured "$i"; then
        return
    fi
    if running "$i"; then
        echo "rabbitmq-cluster: $node runs with an earlier configuration; restarting it"
        stop_node "$i"
    fi
    prepare "$i"
    if reachable "$i"; then
        # The VM is up with the app stopped (a join interrupted, say).
        ctl "$i" rabbitmqctl start_app
    else
        echo "rabbitmq-cluster: starting $node on 127.0.0.1:${AMQP_PORTS[$i]}"
        # From its own directory: the node keeps the working directory it starts in, and
        # one that goes away (a checkout removed) makes it fail whenever it stops its app,
        # as pause_minority does in a partition (`filename:absname` gets enoent), which
        # leaves it running alone with the partition never healed.
        (cd "$dir" && as_rabbit \
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
            /usr/lib/rabbitmq/bin/rabbitmq-server -detached)
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

install_iptables_if_missing() {
    if ! command -v iptables >/dev/null 2>&1; then
        echo "rabbitmq-cluster: installing iptables"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables
    fi
}

# Adds an iptables rule to the chain unless it is there already.
rule() {
    as_root iptables -C "$CHAIN" "$@" 2>/dev/null || as_root iptables -A "$CHAIN" "$@"
}

# Cuts node i off from the other nodes: drops (silently, as a broken network does) the
# traffic to and from its distribution port, which carries the connections the others
# and the CLI tools open to it, and to and from its own source address, which carries
# those it opens to them. Its AMQP port stays open: clients still reach it, and see it
# pause (pause_minority) once it takes the others for down. epmd (4369) is shared with
# every node on the machine, the default one included, so it stays open too; without
# the distribution ports, knowing a port gets a node nowhere.
partition() {
    local i=$1
    install_iptables_if_missing
    as_root iptables -N "$CHAIN" 2>/dev/null || true
    as_root iptables -C OUTPUT -j "$CHAIN" 2>/dev/null || as_root iptables -I OUTPUT -j "$CHAIN"
    rule -p tcp --dport "${DIST_PORTS[$i]}" -j DROP
    rule -p tcp --sport "${DIST_PORTS[$i]}" -j DROP
    rule -s "$(source_ip "$i")" -j DROP
    rule -d "$(source_ip "$i")" -j DROP
    echo "rabbitmq-cluster: ${NODES[$i]} cut off from the others"
}

# Removes every rule `partition` added (idempotent; nothing to do without iptables).
unblock() {
    command -v iptables >/dev/null 2>&1 || return 0
    while as_root iptables -D OUTPUT -j "$CHAIN" 2>/dev/null; do :; done
    as_root iptables -F "$CHAIN" 2>/dev/null || true
    as_root iptables -X "$CHAIN" 2>/dev/null || true
}

# Whether node 1 sees all three nodes running and no partition.
whole() {
    local status
    status=$(ctl 0 rabbitmqctl cluster_status --formatter json 2>/dev/null) || return 1
    python3 -c '
import json, sys
status = json.loads(sys.argv[1])
sys.exit(0 if len(status.get("running_nodes", [])) == 3 and not status.get("partitions") else 1)
' "$status"
}

# Unblocks, then waits for the three nodes to run again (a paused node resumes by
# itself once it sees the majority) and for the cluster to be whole.
heal() {
    unblock
    local deadline=$((SECONDS + BOOT_DEADLINE))
    for i in 0 1 2; do await "$i" running "$BOOT_DEADLINE"; done
    until whole; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "rabbitmq-cluster: the cluster is not whole after $BOOT_DEADLINE s:" >&2
            ctl 0 rabbitmqctl cluster_status >&2 || true
            return 1
        fi
        sleep 1
    done
    echo "rabbitmq-cluster: healed"
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
        # Installed now, not at the first `partition`: a fresh machine's apt-get took
        # 13 s there, inside the partition test's clock for consumption to resume.
        install_iptables_if_missing
        # A partition left by a test that was killed before it healed.
        unblock
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
        unblock
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
    partition)
        partition "$(index_of "${2:-}")"
        ;;
    heal)
        heal
        ;;
    *)
        echo "usage: $0 start|stop|ports|stop-node N|start-node N|partition N|heal" >&2
        exit 2
        ;;
esac
