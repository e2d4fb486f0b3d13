#!/usr/bin/env bash
# A local Redis for the live tests, on 127.0.0.1:6379. Idempotent: safe to run any number
# of times.
#
# Debian's `redis-server` package is installed with apt-get when the server is missing.
# If nothing answers PING on the port, the server is started as a daemon with no
# persistence (no RDB snapshots, no AOF), its working directory $DIR and its log $LOG.
# The script then waits (at most 30 s) for PONG, and checks that the server is Redis
# 6.2 or newer: the Redis Streams transport claims stale entries with XAUTOCLAIM, which
# 6.2 added. redis-cli is used when present, else the inline protocol over bash's
# /dev/tcp.
set -euo pipefail

# The port can be moved (to try this script beside a running server).
HOST=127.0.0.1
PORT=${REDIS_PORT:-6379}
DIR=/var/lib/redis
LOG=/var/log/redis/ci.log
MIN_VERSION=6.2.0
DEADLINE_SECONDS=30

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Sends the inline command "$*" to the server and prints its reply: a status, an error
# or an integer as its line ("+PONG", "-LOADING ..."), a bulk string as its payload.
# Fails if nothing answers within 5 s.
raw_command() {
    # The inner script expands its own arguments.
    # shellcheck disable=SC2016
    LC_ALL=C timeout 5 bash -c '
        host=$1 port=$2 cr=$3
        shift 3
        exec 3<>"/dev/tcp/$host/$port" || exit 1
        printf "%s\r\n" "$*" >&3
        IFS= read -r -t 4 line <&3 || exit 1
        line=${line%"$cr"}
        case $line in
            "\$-1") ;;
            "\$"*) IFS= read -r -t 4 -N "${line#\$}" payload <&3 || exit 1
                   printf "%s\n" "$payload" ;;
            *) printf "%s\n" "$line" ;;
        esac
    ' _ "$HOST" "$PORT" $'\r' "$@" 2>/dev/null
}

# Prints the server's reply to PING ("PONG" once it is ready), or fails if nothing
# answers.
redis_ping() {
    local reply
    if command -v redis-cli >/dev/null 2>&1; then
        reply=$(timeout 5 redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null) || return 1
    else
        reply=$(raw_command PING) || return 1
        reply=${reply#+}
    fi
    printf '%s\n' "$reply"
}

# Prints the server's version (redis_version in INFO server).
version() {
    local info
    if command -v redis-cli >/dev/null 2>&1; then
        info=$(timeout 5 redis-cli -h "$HOST" -p "$PORT" info server 2>/dev/null) || return 1
    else
        info=$(raw_command INFO server) || return 1
    fi
    tr -d '\r' <<<"$info" | sed -n 's/^redis_version://p'
}

# Fails unless the server is Redis $MIN_VERSION or newer.
check_version() {
    local found
    found=$(version || true)
    if [ -z "$found" ]; then
        echo "redis: cannot read the server's version (INFO server) on $HOST:$PORT" >&2
        exit 1
    fi
    # Sorted already when $MIN_VERSION <= $found.
    if ! printf '%s\n%s\n' "$MIN_VERSION" "$found" | sort -V -C; then
        echo "redis: the server on $HOST:$PORT is Redis $found; the tests need $MIN_VERSION" \
            "or newer (XAUTOCLAIM). Stop it and install a newer redis-server." >&2
        exit 1
    fi
    echo "redis: version $found (>= $MIN_VERSION)"
}

if [ "$(redis_ping || true)" = PONG ]; then
    echo "redis: already running on $HOST:$PORT"
    check_version
    exit 0
fi

if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis: installing redis-server"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi

# The package's own service may have been started by the install: start ours only if
# nothing answers yet.
if [ -z "$(redis_ping || true)" ]; then
    echo "redis: starting on $HOST:$PORT (no persistence, dir $DIR, log $LOG)"
    as_root install -d -m 0755 "$DIR"
    as_root install -d -m 0755 "$(dirname "$LOG")"
    if ! as_root redis-server --daemonize yes --bind "$HOST" --port "$PORT" \
        --save "" --appendonly no --dir "$DIR" --logfile "$LOG"; then
        echo "redis: redis-server failed to start; see $LOG" >&2
        exit 1
    fi
fi

# A deadline on the clock, not a count of probes: a probe may itself wait seconds.
reply=
deadline=$((SECONDS + DEADLINE_SECONDS))
while [ "$SECONDS" -lt "$deadline" ]; do
    reply=$(redis_ping || true)
    if [ "$reply" = PONG ]; then
        echo "redis: ready on $HOST:$PORT"
        check_version
        exit 0
    fi
    sleep 0.1
done
if [ -n "$reply" ]; then
    echo "redis: the server on $HOST:$PORT still answers PING with \"$reply\" after" \
        "${DEADLINE_SECONDS} s, not PONG; see $LOG" >&2
else
    echo "redis: nothing answered on $HOST:$PORT within ${DEADLINE_SECONDS} s; see $LOG" >&2
fi
exit 1
