#!/bin/bash
# Record py-spy dumps of real gloo ranks: record.sh FAULT WORLD PORT OUTDIR [py-spy args]
# Example (from the repository root, after make install):
#   tests/data/multinode/record.sh skip 3 29511 tests/data/multinode/skip
#   tests/data/multinode/record.sh stop 4 29515 tests/data/multinode/stop --nonblocking
set -u
FAULT=$1 WORLD=$2 PORT=$3 OUT=$4
shift 4
PY=${ENGINE_WATCHDOG_VLLM_VENV:-.cache/vllm-venv}/bin/python
SPY=.venv/bin/py-spy
HERE=$(dirname "$0")
mkdir -p "$OUT"
pids=()
for r in $(seq 0 $((WORLD - 1))); do
  setsid "$PY" "$HERE/gloo_ranks.py" "$r" "$WORLD" "$PORT" "$FAULT" & pids+=($!)
done
sleep 12 # init_process_group and 50 all_reduce steps
if [ "$FAULT" = stop ]; then kill -STOP "${pids[1]}"; sleep 1; fi
for s in 1 2; do
  for r in $(seq 0 $((WORLD - 1))); do
    timeout 20 "$SPY" dump "$@" --pid "${pids[$r]}" >"$OUT/rank$r.s$s.txt" 2>&1
  done
  sleep 1
done
for p in "${pids[@]}"; do kill -CONT "$p"; kill -KILL -- "-$p" 2>/dev/null; done
wait
