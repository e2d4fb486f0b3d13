#!/usr/bin/env bash
# A local NATS server with JetStream for the live tests, on 127.0.0.1:4222. Idempotent:
# safe to run any number of times.
#
# Debian's `nats-server` package is installed with apt-get when the server is missing.
# If nothing answers on the port, the server is started as a daemon with JetStream on,
# its store in $STORE and its log in $LOG. The script then waits (at most 30 s) until the
# server answers with JetStream enabled, as the INFO line it greets every client with
# says (`"jetstream":true`): the monitoring port is off by default, so the check speaks
# the client protocol. A server already answering without JetStream is an error: the
# tests need it, and this script does not restart a server it did not start.
set -euo pipefail

# The port, store and log can be moved (to try this script beside a running server).
HOST=127.0.0.1
PORT=${NATS_PORT:-4222}
STORE=${NATS_STORE_DIR:-/var/lib/nats-server}
LOG=${NATS_LOG:-/var/log/nats-server.log}
PIDFILE=/run/nats-server-conveyor-$PORT.pid
DEADLINE_SECONDS=30

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# The server's binary: Debian's, or whichever is on PATH.
find_server() {
    if [ -x /usr/sbin/nats-server ]; then
        echo /usr/sbin/nats-server
    else
        command -v nats-server || true
    fi
}

# Prints the JSON of the INFO line the server greets a client with, or fails if nothing
# answers on $HOST:$PORT (within 5 s) or the greeting is not an INFO line.
server_info() {
    local line
    # The inner script expands its own arguments.
    # shellcheck disable=SC2016
    line=$(timeout 5 bash -c \
        'exec 3<>"/dev/tcp/$1/$2" && IFS= read -r -t 4 line <&3 && printf "%s\n" "$line"' \
        _ "$HOST" "$PORT" 2>/dev/null) || return 1
    line=${line%$'\r'}
    [[ $line == "INFO "* ]] || return 1
    printf '%s\n' "${line#INFO }"
}

# Whether INFO JSON ($1) says JetStream is enabled.
jetstream_on() {
    grep -Eq '"jetstream"[[:space:]]*:[[:space:]]*true' <<<"$1"
}

no_jetstream() {
    echo "nats: the server on $HOST:$PORT runs WITHOUT JetStream (its INFO has no" \
        "\"jetstream\":true); the tests need it. Stop that server, then run this script" \
        "again to start one with -js (or restart it with -js yourself)." >&2
    exit 1
}

if info=$(server_info); then
    if jetstream_on "$info"; then
        echo "nats: already running on $HOST:$PORT (JetStream enabled)"
        exit 0
    fi
    no_jetstream
fi

server=$(find_server)
if [ -z "$server" ]; then
    echo "nats: installing nats-server"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server
    server=$(find_server)
    if [ -z "$server" ]; then
        echo "nats: nats-server is still missing after apt-get install nats-server" >&2
        exit 1
    fi
fi

echo "nats: starting $server on $HOST:$PORT with JetStream (store $STORE, log $LOG)"
as_root install -d -m 0755 "$STORE"
as_root install -d -m 0755 "$(dirname "$LOG")"
args=(-a "$HOST" -p "$PORT" -js -sd "$STORE" -l "$LOG")
if command -v start-stop-daemon >/dev/null 2>&1; then
    # The pid file ties --oknodo to the server this script started, not to any
    # nats-server process (one on another port, say).
    as_root start-stop-daemon --start --oknodo --background \
        --pidfile "$PIDFILE" --make-pidfile --exec "$server" -- "${args[@]}"
else
    as_root nohup setsid "$server" "${args[@]}" >/dev/null 2>&1 &
fi

# A deadline on the clock, not a count of probes: a probe may itself wait seconds.
answered=0
deadline=$((SECONDS + DEADLINE_SECONDS))
while [ "$SECONDS" -lt "$deadline" ]; do
    if info=$(server_info); then
        answered=1
        if jetstream_on "$info"; then
            echo "nats: ready on $HOST:$PORT (JetStream enabled, store $STORE)"
            exit 0
        fi
    fi
    sleep 0.2
done
if [ "$answered" -eq 1 ]; then
    no_jetstream
fi
echo "nats: nothing answered on $HOST:$PORT within ${DEADLINE_SECONDS} s of starting" \
    "$server; see $LOG" >&2
exit 1
