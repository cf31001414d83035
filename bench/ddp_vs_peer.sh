#!/usr/bin/env bash
# lockstep DDP vs PyTorch's own DDP (the Python peer in ../shared/peer), side by side in one run:
# same convnet, data (first LIMIT Fashion-MNIST samples), batch per rank, epochs, lr, ranks, and one
# intra-op thread per rank. Runs alternate (lockstep, peer, lockstep, ...) so machine noise hits both;
# prints every run's JSON and the medians. PRECISION bf16 compares `--precision bf16` (O1: autocast,
# no loss scaling) with the peer's `--amp` (torch.autocast bf16, no GradScaler).
# BEFORE=path/to/an/older/lockstep adds that binary as a third alternating column (before/after a
# change, in one invocation).
# Usage: bench/ddp_vs_peer.sh [RUNS=3] [LIMIT=12000] [PRECISION=fp32|bf16]  (after make build; needs python3-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; limit=${2:-12000}; precision=${3:-fp32}; ranks=2; batch=100; epochs=1; lr=0.05
case $precision in
  fp32) ours_amp=(); peer_amp=() ;;
  bf16) ours_amp=(--precision bf16); peer_amp=(--amp) ;;
  *) echo "PRECISION must be fp32 or bf16, not '$precision'" >&2; exit 2 ;;
esac
peer=${PEER_DIR:-../shared/peer}
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "needs Debian's python3-torch (apt-get install python3-torch)" >&2; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p"; }

ours_run() {  # BINARY: one lockstep DDP run, its JSON summary
  OMP_NUM_THREADS=1 "$1" run --nproc-per-node $ranks -- "$1" train --quiet \
    --model convnet --limit "$limit" --epochs $epochs --batch-size $batch --lr $lr --threads 1 "${ours_amp[@]}" |
    grep -o '{.*}'
}

ours=(); theirs=(); ours_rss=(); theirs_rss=(); before=()
for ((i = 1; i <= runs; i++)); do
  if [[ -n ${BEFORE:-} ]]; then
    b=$(ours_run "$BEFORE"); echo "before   run $i: $b"; before+=("$(field samples_per_s <<<"$b")")
  fi
  o=$(ours_run build/lockstep)
  p=$(cd "$peer" && OMP_NUM_THREADS=1 N=$ranks PORT=$((29611 + i)) ./run_ddp.sh --epochs $epochs --limit "$limit" --batch $batch --lr $lr \
        "${peer_amp[@]}")
  echo "lockstep run $i: $o"; echo "peer     run $i: $p"
  ours+=("$(field samples_per_s <<<"$o")"); theirs+=("$(field samples_per_s <<<"$p")")
  ours_rss+=("$(field peak_rss_mib <<<"$o")"); theirs_rss+=("$(field peak_rss_mib <<<"$p")")
done
o=$(printf '%s\n' "${ours[@]}" | median); p=$(printf '%s\n' "${theirs[@]}" | median)
orss=$(printf '%s\n' "${ours_rss[@]}" | median); prss=$(printf '%s\n' "${theirs_rss[@]}" | median)
echo "median samples/s: lockstep $o, peer $p, ratio $(awk -v a="$o" -v b="$p" 'BEGIN {printf "%.2f", a / b}')"
echo "median peak RSS of rank 0 (MiB): lockstep $orss, peer $prss"
if [[ -n ${BEFORE:-} ]]; then
  b=$(printf '%s\n' "${before[@]}" | median)
  echo "median samples/s before: $b; after/before $(awk -v a="$o" -v b="$b" 'BEGIN {printf "%.3f", a / b}'), before/peer $(awk -v a="$b" -v b="$p" 'BEGIN {printf "%.2f", a / b}')"
fi
