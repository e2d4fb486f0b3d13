#!/usr/bin/env bash
# The SQS emulator for the live tests: moto's server on 127.0.0.1:4566. Idempotent:
# installs moto from PyPI if it is missing, starts it if nothing answers on the port.
set -euo pipefail

port=${SQS_EMULATOR_PORT:-4566}
url="http://127.0.0.1:${port}/"

if curl -s -o /dev/null "$url"; then
    echo "sqs emulator: already answering on $url"
    exit 0
fi

if ! python3 -c 'import moto.server' >/dev/null 2>&1; then
    echo "sqs emulator: installing moto[server] from PyPI"
    python3 -m pip install --quiet 'moto[server]>=5,<6'
fi
# pyenv creates the `moto_server` shim only on a rehash: make it, so the tests that start
# an emulator of their own find the command.
if ! command -v moto_server >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
    pyenv rehash || true
fi

log=${TMPDIR:-/tmp}/conveyor-moto-${port}.log
# The module, not the `moto_server` script, so that a missing shim does not matter here.
nohup python3 -m moto.server -H 127.0.0.1 -p "$port" >"$log" 2>&1 &

for _ in $(seq 1 100); do
    if curl -s -o /dev/null "$url"; then
        echo "sqs emulator: started on $url (log: $log)"
        exit 0
    fi
    sleep 0.1
done
echo "sqs emulator: did not answer on $url within 10 s; see $log" >&2
exit 1
