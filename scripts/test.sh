#!/usr/bin/env bash
# The whole test suite, as CI runs it: start the live services the tests need, then check
# formatting, lints and docs, then run every test (unit, integration, examples, doctests).
set -euo pipefail
cd "$(dirname "$0")/.."

for service in scripts/services/*.sh; do
    [ -e "$service" ] || continue
    # The three-node cluster is started by hand for its own tests (see its header).
    [ "$(basename "$service")" = rabbitmq-cluster.sh ] && continue
    echo "== starting $(basename "$service" .sh)"
    bash "$service"
done

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
echo "== cargo test"
cargo test --workspace
