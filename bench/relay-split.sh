#!/usr/bin/env bash
# Where a PostgreSQL relay's CPU goes, by hand (Linux; psql on the PATH).
#
#   bench/relay-split.sh [EVENTS] BIN...
#
# For each BIN (a `ratchet` binary) in turn, round after round: a backlog
# of EVENTS events (40,000 by default) over 256 runs is written straight
# into a database of the binary's own on the server (`ratchet_relay_split_N`
# for the Nth BIN, so that binaries of different schemas compare), and
# `BIN relay --until-idle` delivers it to a scratch JetStream stream.
# Printed per run: events/s, and the CPU time per delivered event of the
# whole machine, the PostgreSQL server, the NATS server and the relay
# (µs). Scenario 8 of `ratchet bench` is the measure against raw
# publishes; this splits the relay's side of it. A PostgreSQL figure near
# zero is a reading taken while the server was still reaping the relay's
# connections: run that round again. The database stays for the next run
# (`DROP DATABASE ratchet_relay_split_1` and so on remove them); the stream
# is deleted.
#
# RATCHET_BENCH_POSTGRES: the server (postgres://postgres@127.0.0.1:5432/test)
# RATCHET_BENCH_NATS: nats://HOST:PORT (nats://127.0.0.1:4222)
# ROUNDS: rounds over the binaries (3)
set -euo pipefail

events=40000
if [[ ${1:-} =~ ^[0-9]+$ ]]; then events=$1; shift; fi
(($# > 0)) || { echo "usage: $0 [EVENTS] BIN..." >&2; exit 2; }
server=${RATCHET_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}
nats=${RATCHET_BENCH_NATS:-nats://127.0.0.1:4222}
stream=RATCHET_RELAY_SPLIT
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The Nth binary's database, made and migrated to its schema.
database() {
    local name=ratchet_relay_split_$1
    psql -q "$server" -Atc "SELECT 1 FROM pg_database WHERE datname = '$name'" |
        grep -q 1 || psql -q "$server" -c "CREATE DATABASE $name"
    echo "${server%/*}/$name"
}
dbs=()
for bin in "$@"; do
    dbs+=("$(database $((${#dbs[@]} + 1)))")
    "$bin" outbox --db "${dbs[-1]}" > /dev/null # migrates the schema
done

cat > "$work/sinks.toml" << EOF
[[sink]]
name = "bus"
type = "nats"
url = "$nats"
stream = "$stream"
subject = "relay-split.{event}"
create_stream = true
events = ["*"]
EOF

# Deletes the stream (and the ids its duplicate window holds).
delete_stream() {
    local hostport=${nats#nats://}
    exec 3<> "/dev/tcp/${hostport%:*}/${hostport#*:}"
    printf 'CONNECT {"verbose":false}\r\nPUB $JS.API.STREAM.DELETE.%s 0\r\n\r\nPING\r\n' "$stream" >&3
    while read -r -t 5 line <&3 && [[ $line != PONG* ]]; do :; done
    exec 3>&-
}

# A fresh backlog whose dedup keys carry `$1`.
backlog() {
    psql -q "$db" -v tag="$1" -v n="$events" > /dev/null << 'EOF'
SET client_min_messages = warning;
TRUNCATE deliveries, delivery_lanes, outbox_unrouted, outbox, runs CASCADE;
INSERT INTO runs (id, pipeline, state, created_at)
SELECT 'run-' || md5(g::text), 'split', 'running', 0 FROM generate_series(0, 255) g;
INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
SELECT 'run-' || md5((g % 256)::text) || '/' || :'tag' || '-' || g || '/raw',
       'run-' || md5((g % 256)::text), 'raw', 'artifact.raw',
       '{"event":"artifact.raw","outputs":{"out":"sha256:' || md5(g::text) || md5(g::text) || '"}}', 0
FROM generate_series(1, :n) g;
CHECKPOINT;
EOF
}

# Busy jiffies: the machine, the PostgreSQL server (its live processes and
# those it reaped), the NATS server.
jiffies() {
    local pm pg pid
    pm=$(pgrep -o -f 'bin/postgres -D')
    pg=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat")
    for pid in $(pgrep -P "$pm"); do
        pg=$((pg + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2> /dev/null || echo 0)))
    done
    echo "$(awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat) $pg" \
        "$(awk '{print $14 + $15}' "/proc/$(pgrep -o nats-server)/stat")"
}

# CPU seconds of this shell's finished children, from `times` (run in this
# shell, not a subshell: a subshell's children are its own).
children_s() {
    times > "$work/times"
    awk 'NR == 2 {
        for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] }
        print s }' "$work/times"
}

hz=$(getconf CLK_TCK)
bins=("$@")
for round in $(seq "${ROUNDS:-3}"); do
    for i in "${!bins[@]}"; do
        bin=${bins[i]} db=${dbs[i]}
        backlog "$round-$bin-$$"
        delete_stream
        children_s > "$work/r0"
        read -r m0 p0 n0 < <(jiffies)
        t0=$(date +%s%N)
        "$bin" relay --db "$db" --sinks "$work/sinks.toml" --until-idle 2> "$work/log"
        t1=$(date +%s%N)
        read -r m1 p1 n1 < <(jiffies)
        children_s > "$work/r1"
        awk -v b="$bin" -v n="$events" -v ns=$((t1 - t0)) -v hz="$hz" \
            -v r="$(cat "$work/r0" "$work/r1")" \
            -v m=$((m1 - m0)) -v p=$((p1 - p0)) -v q=$((n1 - n0)) 'BEGIN {
                split(r, t, "\n"); us = 1e6 / hz / n
                printf "%s: %.0f events/s; CPU µs per event: machine %.1f, postgres %.1f, nats %.1f, relay %.1f\n",
                    b, n / (ns / 1e9), m * us, p * us, q * us, (t[2] - t[1]) * 1e6 / n }'
    done
done
delete_stream
