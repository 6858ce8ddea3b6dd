#!/usr/bin/env bash
# Chaos by hand, independent of the test harness: runs the demo workload with
# several `ratchet worker` processes, SIGKILLs a random one at random moments
# and restarts it, then drains, audits and prints the figures.
#
#   tests/chaos.sh [DB_URL] [WORKERS] [RUNS] [KILLS]
#   tests/chaos.sh postgres://postgres@127.0.0.1:5432/test 6 2000 500
#
# Needs a built `ratchet` (cargo build --release) and bash; a run with
# `2 20 10` on SQLite took 8 s here.
set -euo pipefail
DB=${1:-sqlite:///tmp/ratchet-chaos.db}
WORKERS=${2:-4}
RUNS=${3:-200}
KILLS=${4:-100}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RATCHET=${RATCHET:-$ROOT/target/release/ratchet}
[ -x "$RATCHET" ] || { echo "build first: cargo build --release (or set RATCHET=path)"; exit 2; }
export RATCHET_DB=$DB RATCHET_LOG=error

"$RATCHET" demo --runs 1 >/dev/null             # registers the bundled plugins
for _ in $(seq "$RUNS"); do "$RATCHET" run "$ROOT/plugins/demo.toml" >/dev/null; done

declare -a PIDS
start() { "$RATCHET" worker --concurrency 2 --lease-ms 1000 --worker-id "chaos-$1-$RANDOM" & PIDS[$1]=$!; }
for i in $(seq 0 $((WORKERS - 1))); do start "$i"; done
for k in $(seq "$KILLS"); do
    sleep "0.$((RANDOM % 10))"
    victim=$((RANDOM % WORKERS))
    kill -9 "${PIDS[$victim]}" 2>/dev/null || true
    wait "${PIDS[$victim]}" 2>/dev/null || true
    start "$victim"
done
for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
wait || true
"$RATCHET" worker --until-idle --concurrency 4 --lease-ms 1000

echo "kills: $KILLS, runs submitted: $((RUNS + 1))"
"$RATCHET" status | awk 'NR > 1 { n[$3]++ } END { for (s in n) print "runs " s ": " n[s] }'
"$RATCHET" audit
