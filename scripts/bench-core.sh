#!/usr/bin/env bash
# Instructions per delivery of Conveyor's core on the in-process transport, per dispatch
# mode, counted by callgrind on a current-thread runtime (deterministic).
#
# The bench's measurement window opens after the warm-up and closes after N deliveries;
# callgrind counts only inside it (--zero-before=window_open, --dump-before=window_close).
# Each mode runs with N and 2N messages, so that what happens once per window cancels:
#   instructions/delivery = (Ir(2N) - Ir(N)) / N
#
# Usage: scripts/bench-core.sh [N]    (default N=20000; honours CARGO_TARGET_DIR and
#        MODES, a list of the modes to measure)
#        OBSERVE=1 scripts/bench-core.sh [N]   spans and metrics on (`--observe`), then
#        the floor: the same calls into `tracing` and `metrics` with no Conveyor
#        (`benches/observe_floor.rs`), per iteration: a sequential delivery's (`both`, and
#        its `span` and `metrics` halves), and those of the modes that make more
#        (`lanes`, `any-worker`, `end-to-end`)
# Needs valgrind. Prefix with `nice -n 10` on a shared machine.
set -euo pipefail

cd "$(dirname "$0")/.."
n=${1:-20000}
warmup=10000
# MODES="lanes batch" measures only those.
read -r -a modes <<< "${MODES:-sequential bytes keyed workers lanes any-worker batch end-to-end}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Builds bench `name` in release (the bench profile), with the cargo options after it,
# and prints its executable's path.
bench_binary() {
    local name=$1 path
    shift
    path=$(cargo bench -p conveyor-benches --bench "$name" "$@" --no-run --message-format=json \
        | { grep -o "\"executable\":\"[^\"]*$name-[^\"]*\"" || true; } | tail -n 1 | cut -d'"' -f4)
    if [[ -z "$path" || ! -x "$path" ]]; then
        echo "bench-core: could not find the $name bench binary" >&2
        exit 1
    fi
    echo "$path"
}

features=() observe=()
if [[ ${OBSERVE:-0} == 1 ]]; then
    features=(--features observe) observe=(--observe)
fi
bin=$(bench_binary dispatch ${features[@]+"${features[@]}"})

# Ir inside the window of one run of `mode` with `messages` measured deliveries.
window_ir() {
    local mode=$1 messages=$2
    callgrind_window "$out/$mode.$messages" \
        "$bin" --mode "$mode" --runtime current --warmup "$warmup" --messages "$messages" ${observe[@]+"${observe[@]}"}
}

# Ir inside the window of one run of the command after `file`, its profile in `file`.
callgrind_window() {
    local file=$1
    shift
    valgrind --tool=callgrind --callgrind-out-file="$file" \
        --zero-before='*window_open*' --dump-before='*window_close*' \
        "$@" >/dev/null 2>"$file.log"
    # The dump taken on entering window_close holds exactly the window.
    local ir
    ir=$(grep -h '^summary:' "$file.1" 2>/dev/null | awk '{print $2}')
    if [[ -z "$ir" ]]; then
        echo "bench-core: no window dump for $*; see below" >&2
        cat "$file.log" >&2
        exit 1
    fi
    echo "$ir"
}

echo "callgrind, current-thread runtime, warm-up $warmup, N=$n"
printf '%-11s %16s %16s %14s\n' mode "Ir(N)" "Ir(2N)" "instr/delivery"
for mode in "${modes[@]}"; do
    one=$(window_ir "$mode" "$n")
    two=$(window_ir "$mode" $((2 * n)))
    printf '%-11s %16d %16d %14d\n' "$mode" "$one" "$two" $(((two - one) / n))
done

if [[ ${OBSERVE:-0} == 1 ]]; then
    floor=$(bench_binary observe_floor --features observe)
    echo
    echo "floor: the same calls into tracing and metrics, no Conveyor (benches/observe_floor.rs)"
    printf '%-11s %16s %16s %14s\n' calls "Ir(N)" "Ir(2N)" "instr/iteration"
    for calls in span metrics both lanes any-worker end-to-end; do
        one=$(callgrind_window "$out/floor.$calls.$n" "$floor" --calls "$calls" --warmup "$warmup" --iterations "$n")
        two=$(callgrind_window "$out/floor.$calls.$((2 * n))" "$floor" --calls "$calls" --warmup "$warmup" --iterations $((2 * n)))
        printf '%-11s %16d %16d %14d\n' "$calls" "$one" "$two" $(((two - one) / n))
    done
fi
