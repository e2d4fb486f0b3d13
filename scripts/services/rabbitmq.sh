#!/usr/bin/env bash
# Starts a local RabbitMQ for the live tests, if it is not running, enables the
# consistent-hash exchange plugin, and gives it a TLS listener. Idempotent: safe to run
# any number of times.
#
# Debian's `rabbitmq-server` package is installed with apt-get when missing. The tests
# talk to 127.0.0.1:5672 (AMQP) and 127.0.0.1:5671 (AMQPS) as guest/guest.
#
# TLS: a throwaway CA and a server certificate for localhost / 127.0.0.1 are generated
# once (with the openssl CLI) into $TLS_DIR, and rabbitmq.conf gets a TLS listener that
# uses them. The CA certificate the AMQPS tests trust is $TLS_DIR/ca_certificate.pem
# (world-readable; the tests read it from there unless CONVEYOR_RABBITMQ_CA names
# another file). If the running node does not listen on 5671 yet, or its TLS settings
# changed, it is restarted.
set -euo pipefail

TLS_DIR=/etc/rabbitmq/conveyor-tls
CONF=/etc/rabbitmq/rabbitmq.conf
TLS_PORT=5671

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "rabbitmq: installing rabbitmq-server"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server
fi

# Set when the TLS material or settings change, so that a running node is restarted.
changed=0

# --- TLS material: a CA and a server certificate signed by it (generated once) -------
if ! as_root test -s "$TLS_DIR/ca_certificate.pem" \
    || ! as_root test -s "$TLS_DIR/server_certificate.pem" \
    || ! as_root test -s "$TLS_DIR/server_key.pem"; then
    if ! command -v openssl >/dev/null 2>&1; then
        echo "rabbitmq: installing openssl"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl
    fi
    echo "rabbitmq: generating a throwaway CA and server certificate in $TLS_DIR"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # The CA: self-signed, allowed to sign certificates.
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
        -subj "/CN=Conveyor test CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$work/ca_key.pem" -out "$work/ca_certificate.pem" 2>/dev/null
    # The server: a key, a request, and a certificate the CA signs for localhost and
    # 127.0.0.1.
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" \
        -keyout "$work/server_key.pem" -out "$work/server.csr" 2>/dev/null
    cat >"$work/server.ext" <<'EOF'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
EOF
    openssl x509 -req -in "$work/server.csr" -days 3650 -sha256 \
        -CA "$work/ca_certificate.pem" -CAkey "$work/ca_key.pem" -CAcreateserial \
        -extfile "$work/server.ext" -out "$work/server_certificate.pem" 2>/dev/null
    openssl verify -CAfile "$work/ca_certificate.pem" "$work/server_certificate.pem" >/dev/null

    as_root install -d -m 0755 "$TLS_DIR"
    as_root install -m 0644 "$work/ca_certificate.pem" "$TLS_DIR/ca_certificate.pem"
    as_root install -m 0644 "$work/server_certificate.pem" "$TLS_DIR/server_certificate.pem"
    # The server key: readable by the rabbitmq user only. The CA key is not kept: no
    # other certificate is ever signed with it.
    as_root install -m 0640 -o root -g rabbitmq "$work/server_key.pem" "$TLS_DIR/server_key.pem"
    rm -rf "$work"
    trap - EXIT
    changed=1
fi

# --- rabbitmq.conf: the TLS listener (other lines are kept as they are) --------------
# Sets `key = value` in $CONF: replaces the key's line if it is there with another
# value, appends it if it is missing, and leaves the file alone if it already matches.
set_conf() {
    local key=$1 value=$2
    if as_root grep -Eq "^[[:space:]]*${key//./\\.}[[:space:]]*=[[:space:]]*${value//./\\.}[[:space:]]*$" "$CONF" 2>/dev/null; then
        return
    fi
    if as_root grep -Eq "^[[:space:]]*${key//./\\.}[[:space:]]*=" "$CONF" 2>/dev/null; then
        as_root sed -i -E "s|^[[:space:]]*${key//./\\.}[[:space:]]*=.*$|${key} = ${value}|" "$CONF"
    else
        # Makes sure the file ends with a newline before appending.
        if as_root test -s "$CONF" && [ -n "$(as_root tail -c1 "$CONF")" ]; then
            echo | as_root tee -a "$CONF" >/dev/null
        fi
        echo "${key} = ${value}" | as_root tee -a "$CONF" >/dev/null
    fi
    changed=1
}
as_root touch "$CONF"
set_conf listeners.ssl.local "127.0.0.1:$TLS_PORT"
set_conf ssl_options.cacertfile "$TLS_DIR/ca_certificate.pem"
set_conf ssl_options.certfile "$TLS_DIR/server_certificate.pem"
set_conf ssl_options.keyfile "$TLS_DIR/server_key.pem"
set_conf ssl_options.verify verify_none
set_conf ssl_options.fail_if_no_peer_cert false

# --- the node --------------------------------------------------------------------------
if as_root rabbitmqctl -q status >/dev/null 2>&1; then
    echo "rabbitmq: already running"
else
    echo "rabbitmq: starting"
    as_root rabbitmq-server -detached
    changed=0 # a node started now reads the current settings
fi

# Waits until the node has booted. A node started a moment ago may not have registered
# with epmd yet, which await_startup reports at once as "not running": try again for a
# minute before failing.
await_node() {
    for _ in $(seq 60); do
        as_root rabbitmqctl -q await_startup --timeout 120 >/dev/null 2>&1 && return
        sleep 1
    done
    as_root rabbitmqctl -q await_startup --timeout 120
}
await_node

listens_tls() {
    as_root rabbitmq-diagnostics -q listeners 2>/dev/null | grep -q "port: $TLS_PORT,"
}
if [ "$changed" -eq 1 ] || ! listens_tls; then
    echo "rabbitmq: restarting to (re)load the TLS listener on 127.0.0.1:$TLS_PORT"
    as_root rabbitmqctl -q stop
    # Waits (up to 60 s) until the old node is gone before starting the new one.
    for _ in $(seq 60); do
        as_root rabbitmqctl -q status >/dev/null 2>&1 || break
        sleep 1
    done
    as_root rabbitmq-server -detached
    await_node
fi
if ! listens_tls; then
    echo "rabbitmq: no TLS listener on 127.0.0.1:$TLS_PORT; see the node's log" >&2
    exit 1
fi

as_root rabbitmq-plugins -q enable rabbitmq_consistent_hash_exchange >/dev/null
echo "rabbitmq: ready on 127.0.0.1:5672 (consistent-hash exchange enabled)"
echo "rabbitmq: TLS ready on 127.0.0.1:$TLS_PORT; CA certificate: $TLS_DIR/ca_certificate.pem"
