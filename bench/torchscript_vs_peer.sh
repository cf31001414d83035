#!/usr/bin/env bash
# A model written in Python, trained by lockstep from its TorchScript file against PyTorch's own DDP
# running the Python code (issue 30's throughput bar: the interpreter must not give back what the
# distributed step won). The model is tests/python/torchscript_models.py's residual MLP (Flatten,
# Linear(784, W), two pre-LayerNorm GELU blocks of W -> 2W -> W, Linear(W, 10)). Both sides train one
# epoch of the first LIMIT Fashion-MNIST samples, BATCH per rank, lr 0.05, 2 ranks x 1 intra-op
# thread over Gloo; the peer is ../shared/peer/fmnist_ddp.py's loop (bench/torchscript_peer.py adds
# the model to it). Runs alternate (lockstep, peer, lockstep, ...) and the table gives medians.
# Usage: bench/torchscript_vs_peer.sh [RUNS=5] [WIDTH=256] [LIMIT=30000] [BATCH=64]  (after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}; width=${2:-256}; limit=${3:-30000}; batch=${4:-64}; lr=0.05
py=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
$py -c 'import torch' 2>/dev/null || { echo "needs $py with torch (scripts/bootstrap --test)" >&2; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p"; }

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
$py bench/torchscript_peer.py write "$width" "$tmp/model.pt"
ours=(); peer=(); ours_rss=(); peer_rss=(); port=29711
for ((i = 1; i <= runs; i++)); do
  o=$(OMP_NUM_THREADS=1 build/lockstep run --nproc-per-node 2 -- build/lockstep train --quiet --model-file "$tmp/model.pt" \
        --strategy ddp --limit "$limit" --epochs 1 --batch-size "$batch" --lr $lr --threads 1 | grep -o '{.*}')
  echo "lockstep run $i: $o"
  port=$((port + 1))
  for r in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r OMP_NUM_THREADS=1 \
      $py bench/torchscript_peer.py "$width" --epochs 1 --limit "$limit" --batch "$batch" --lr $lr >"$tmp/peer.$r" &
  done
  wait
  p=$(cat "$tmp/peer.0")
  echo "peer     run $i: $p"
  ours+=("$(field samples_per_s <<<"$o")"); peer+=("$(field samples_per_s <<<"$p")")
  ours_rss+=("$(field peak_rss_mib <<<"$o")"); peer_rss+=("$(field peak_rss_mib <<<"$p")")
done
mo=$(printf '%s\n' "${ours[@]}" | median); mp=$(printf '%s\n' "${peer[@]}" | median)
echo
echo "medians of $runs alternating runs"
bench/machine.sh "bench/torchscript_vs_peer.sh $runs $width $limit $batch"
echo "| model | samples | batch/rank | lockstep --model-file, 2 ranks | peer (Python DDP), 2 ranks | vs peer | rank-0 RSS MiB (ours / peer) |"
echo "|---|---|---|---|---|---|---|"
echo "| residual MLP, width $width | $limit | $batch | $mo | $mp | $(awk -v a="$mo" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')x | $(printf '%s\n' "${ours_rss[@]}" | median) / $(printf '%s\n' "${peer_rss[@]}" | median) |"
