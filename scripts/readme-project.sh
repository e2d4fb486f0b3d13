#!/usr/bin/env bash
# Builds a fresh project beside the checkout from the README alone: its Cargo.toml is the
# README's "use it in a project" dependency block, its main.rs the README's service, plus
# one line naming each transport's broker and the lapin conveyor-lapin re-exports. It
# proves that a user needs no `[patch]` section: the block must not have one, and the
# project resolves its dependencies afresh (no Cargo.lock of ours), as a user's would.
#
# Usage: scripts/readme-project.sh   (CARGO_TARGET_DIR is honoured; the default is the
# workspace's target/, so that dependencies the workspace already built are reused)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"

# The README's paths are `../conveyor/crates/...`: the project sits beside a checkout
# named `conveyor`.
parent=$(mktemp -d)
trap 'rm -rf "$parent"' EXIT
ln -s "$repo" "$parent/conveyor"
project="$parent/readme-project"
mkdir -p "$project/src"

# The first fenced block of each kind after its heading line.
block() { # $1: a line of the README before the block, $2: the block's language
    awk -v anchor="$1" -v fence="\`\`\`$2" '
        index($0, anchor) { seen = 1; next }
        seen && !inside && index($0, fence) == 1 { inside = 1; next }
        inside && /^```/ { exit }
        inside { print }
    ' "$repo/README.md"
}

dependencies=$(block "To use it in a project" toml)
service=$(block "## A service" rust)
if [ -z "$dependencies" ] || [ -z "$service" ]; then
    echo "readme-project: the README's dependency block or service block was not found" >&2
    exit 1
fi
if grep -q '^\[patch' <<<"$dependencies"; then
    echo "readme-project: the README's dependency block patches a crate" >&2
    exit 1
fi

cat >"$project/Cargo.toml" <<EOF
[package]
name = "readme-project"
version = "0.1.0"
edition = "2024"
publish = false

$dependencies
EOF

cat >"$project/src/main.rs" <<EOF
$service

/// Every transport of the dependency block, and the lapin it re-exports, resolve.
#[allow(dead_code)]
fn transports(
    _: conveyor_lapin::LapinBroker,
    _: conveyor_sqs::SqsBroker,
    _: conveyor_nats::NatsBroker,
    _: conveyor_redis::RedisBroker,
    _: conveyor_lapin::lapin::ConnectionProperties,
) {
}
EOF

echo "readme-project: building $project (target $CARGO_TARGET_DIR)"
cargo check --quiet --manifest-path "$project/Cargo.toml"
echo "readme-project: the README's dependency block builds the README's service with no [patch]"
