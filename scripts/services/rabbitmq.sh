#!/usr/bin/env bash
# Starts a local RabbitMQ for the live tests, if it is not running, and enables the
# consistent-hash exchange plugin. Idempotent: safe to run any number of times.
#
# Debian's `rabbitmq-server` package is installed with apt-get when missing. The tests
# talk to 127.0.0.1:5672 as guest/guest.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "rabbitmq: installing rabbitmq-server"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server
fi

if as_root rabbitmqctl -q status >/dev/null 2>&1; then
    echo "rabbitmq: already running"
else
    echo "rabbitmq: starting"
    as_root rabbitmq-server -detached
fi

# Waits until the node has booted (or fails after its own timeout).
as_root rabbitmqctl -q await_startup --timeout 120

as_root rabbitmq-plugins -q enable rabbitmq_consistent_hash_exchange >/dev/null
echo "rabbitmq: ready on 127.0.0.1:5672 (consistent-hash exchange enabled)"
