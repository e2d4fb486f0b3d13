#!/usr/bin/env bash
# Starts RabbitMQ if needed, then runs the RabbitMQ transport's tests (live ones
# included) against 127.0.0.1:5672.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services/rabbitmq.sh
exec cargo test -p conveyor-lapin "$@"
