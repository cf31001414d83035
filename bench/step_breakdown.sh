#!/usr/bin/env bash
# The training step taken apart, lockstep against the Python peer, one process and two ranks:
# milliseconds per step in each phase (data, forward, loss, backward, sync, optimizer), medians of
# RUNS alternating runs. lockstep's phases come from `lockstep train --profile` (rank 0), the peer's
# from bench/peer_step_profile.py (the peer's loop with the same phases timed). One process shows the
# compute; two ranks add the gradient all-reduce, overlapped with backward and waited for after it
# (lockstep's "sync"; the peer waits inside backward), so 2-rank minus 1-process is what
# communication costs each side.
# Usage: bench/step_breakdown.sh [RUNS=3] [MODEL=convnet] [PRECISION=fp32|bf16] [LIMIT=12000] [BATCH=100]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; model=${2:-convnet}; precision=${3:-fp32}; limit=${4:-12000}; batch=${5:-100}
peer=${PEER_DIR:-../shared/peer}
python=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
[[ -x build/lockstep ]] || { echo "no build/lockstep: run make build first" >&2; exit 1; }
ours_amp=(); peer_amp=()
[[ $precision == bf16 ]] && ours_amp=(--precision bf16) && peer_amp=(--amp)
out=$(mktemp); trap 'rm -f "$out"' EXIT
port() { $python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

ours() {  # NPROC: lockstep's profile table, as "phase ms" lines
  local cmd=(build/lockstep train --model "$model" --limit "$limit" --batch-size "$batch" --lr 0.05 --threads 1
             "${ours_amp[@]}" --profile)
  [[ $1 -gt 1 ]] && cmd=(build/lockstep run --nproc-per-node "$1" -- "${cmd[@]}")
  OMP_NUM_THREADS=1 "${cmd[@]}" 2>&1 | sed 's/^\[rank 0\] //' |
    awk '/^phase +ms\/step/ {on = 1; next} on && NF >= 2 && $1 != "step" && $1 != "other" {print $1, $2} $1 == "step" {on = 0}'
}
theirs() {  # NPROC: the peer's phases, as "phase ms" lines
  local p; p=$(port); local pids=()
  for ((r = 0; r < $1; r++)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$p WORLD_SIZE=$1 RANK=$r OMP_NUM_THREADS=1 \
      $python bench/peer_step_profile.py --peer-dir "$peer" --model "$model" --limit "$limit" --batch "$batch" \
      "${peer_amp[@]}" >"$out.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  $python -c 'import json,sys; [print(k, v) for k, v in json.load(open(sys.argv[1]))["phases"].items()]' "$out.0"
  rm -f "$out".*
}

for i in $(seq "$runs"); do
  for n in 1 2; do
    ours "$n" | sed "s/^/lockstep $n /" >>"$out"
    theirs "$n" | sed "s/^/peer $n /" >>"$out"
  done
  echo "run $i of $runs done" >&2
done

echo "$model $precision, $limit samples, batch $batch per rank, 1 thread per process; ms per step, medians of $runs runs"
bench/machine.sh "bench/step_breakdown.sh $*"
$python - "$out" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, n, phase, ms = line.split()
    rows[(side, n, phase)].append(float(ms))
phases = ["data", "forward", "loss", "backward", "sync", "optimizer"]
cols = [("lockstep", "1"), ("lockstep", "2"), ("peer", "1"), ("peer", "2")]
med = lambda k: statistics.median(rows[k]) if rows[k] else 0.0
print("| phase | " + " | ".join(f"{s} {n}p" for s, n in cols) + " | lockstep 2p-1p | peer 2p-1p |")
print("|---" * (len(cols) + 3) + "|")
total = {c: 0.0 for c in cols}
for ph in phases:
    v = {c: med((c[0], c[1], ph)) for c in cols}
    for c in cols: total[c] += v[c]
    print(f"| {ph} | " + " | ".join(f"{v[c]:.2f}" for c in cols) +
          f" | {v[cols[1]] - v[cols[0]]:+.2f} | {v[cols[3]] - v[cols[2]]:+.2f} |")
print("| **step** | " + " | ".join(f"**{total[c]:.2f}**" for c in cols) +
      f" | {total[cols[1]] - total[cols[0]]:+.2f} | {total[cols[3]] - total[cols[2]]:+.2f} |")
PY
