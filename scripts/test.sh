#!/usr/bin/env bash
# The whole test suite, as CI runs it: start the live services the tests need (the
# three-node RabbitMQ cluster boots in the background meanwhile), then check formatting,
# lints and docs, then run every test (unit, integration, examples, doctests, and the
# cluster's failover and partition tests, CONVEYOR_RABBITMQ_CLUSTER=1), and build a fresh
# project from the README's dependency block (scripts/readme-project.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite is one build from scratch: incremental caches would add some 8 GB to
# target/ and save nothing (Cargo.toml's [profile.dev] says why disk matters).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

for service in scripts/services/*.sh; do
    [ -e "$service" ] || continue
    # The three-node cluster takes a subcommand; it is started below.
    [ "$(basename "$service")" = rabbitmq-cluster.sh ] && continue
    echo "== starting $(basename "$service" .sh)"
    bash "$service"
done

# The three-node RabbitMQ cluster for crates/conveyor-lapin/tests/cluster.rs (node
# failover and partition tests, some 3 minutes of the test run). It boots in the
# background (20 to 40 s) while the checks below run, and is waited for before the
# tests; CONVEYOR_RABBITMQ_CLUSTER=1 then makes `cargo test` run them.
echo "== starting rabbitmq-cluster (in the background)"
cluster_log=$(mktemp)
bash scripts/services/rabbitmq-cluster.sh start >"$cluster_log" 2>&1 &
cluster_pid=$!

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== the core's transport contract imports nothing app-level"
python3 scripts/module-graph.py crates/conveyor/src \
    --leaf transport,message,headers,delivery,outcome,admin,error,encode,clock
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
# The workspace build turns the core's optional features on (tests and examples ask for
# them); lint the core once as a service without them builds it.
cargo clippy -p conveyor --lib -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "== the README's dependency block, in a fresh project beside the checkout"
bash scripts/readme-project.sh
echo "== waiting for rabbitmq-cluster"
if ! wait "$cluster_pid"; then
    cat "$cluster_log" >&2
    echo "rabbitmq-cluster did not start" >&2
    exit 1
fi
grep '^rabbitmq-cluster: ready' "$cluster_log" || true
echo "== cargo test"
CONVEYOR_RABBITMQ_CLUSTER=1 cargo test --workspace
