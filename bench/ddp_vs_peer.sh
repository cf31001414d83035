#!/usr/bin/env bash
# lockstep DDP vs PyTorch's own DDP (the Python peer in ../shared/peer), side by side in one run.
# Each case is MODEL:PRECISION:LIMIT:BATCH: the first LIMIT Fashion-MNIST samples, BATCH per rank, one
# epoch, lr 0.05, 2 ranks x 1 intra-op thread, and the same model on both sides (convnet, or the
# communication-bound mlp-wide). PRECISION bf16 compares `--precision bf16` (O1: autocast, no loss
# scaling) with the peer's `--amp` (torch.autocast bf16, no GradScaler). Within a case the runs
# alternate (lockstep 2 ranks, peer 2 ranks, lockstep 1 process, ...) so machine noise hits all of
# them; every run's JSON is printed, then one table of medians and ratios:
#   vs peer  = lockstep 2 ranks / peer 2 ranks (samples/s)
#   scaling  = lockstep 2 ranks / lockstep 1 process (the same model, batch and thread count)
# PROFILE=1 adds a lockstep single-process column with --profile (its overhead: 1 - prof/single).
# BEFORE=path/to/an/older/lockstep adds that binary's 2-rank runs as a column (before/after a change).
# BOUND=1 adds the ceiling this machine puts on scaling: two independent single processes (each with
# half the samples, no communication) started together, their samples/s summed. 2 ranks can at best
# reach it; bound / single is what sharing the cores' caches and memory bandwidth leaves of 2x.
# COMPILE=1 adds the peer with torch.compile (bench/fmnist_ddp.py --compile; its compiling step untimed).
# PEER_BEFORE=PYTHON adds the peer run by another Python (/usr/bin/python3: Debian's torch 1.13).
# Usage: bench/ddp_vs_peer.sh [RUNS=5] [CASES...]   (after make build; the peer runs on $PEER_PY, default the venv's python)
#   default cases: convnet:fp32:60000:100 convnet:bf16:60000:100 mlp-wide:fp32:12000:32 mlp-wide:bf16:12000:32
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}; shift || true
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(convnet:fp32:60000:100 convnet:bf16:60000:100 mlp-wide:fp32:12000:32 mlp-wide:bf16:12000:32)
ranks=2; lr=0.05
peer=${PEER_DIR:-bench}   # bench/fmnist_ddp.py: shared/peer's, with --compile
export PEER_PY=${PEER_PY:-$PWD/.venv/bin/python}
"$PEER_PY" -c 'import torch' 2>/dev/null || { echo "needs $PEER_PY with torch (scripts/bootstrap --test)" >&2; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

# BINARY NPROC MODEL LIMIT BATCH EXTRA...: one lockstep run's JSON summary.
ours_run() {
  local bin=$1 nproc=$2 model=$3 limit=$4 batch=$5; shift 5
  local train=("$bin" train --quiet --model "$model" --limit "$limit" --epochs 1 --batch-size "$batch" --lr $lr --threads 1 "$@")
  if ((nproc > 1)); then
    OMP_NUM_THREADS=1 "$bin" run --nproc-per-node "$nproc" -- "${train[@]}" | grep -o '{.*}'
  else
    OMP_NUM_THREADS=1 "${train[@]}" | grep -o '{.*}'
  fi
}

tmp=$(mktemp); trap 'rm -f "$tmp" "$tmp".*' EXIT
table="| model | precision | samples | batch/rank | lockstep 2 ranks | peer 2 ranks | vs peer | lockstep 1 proc | scaling | rank-0 RSS MiB (ours / peer) |"
table+=$'\n'"|---|---|---|---|---|---|---|---|---|---|"
extra=""
port=29611
for c in "${cases[@]}"; do
  IFS=: read -r model precision limit batch <<<"$c"
  case $precision in
    fp32) ours_amp=(); peer_amp=() ;;
    bf16) ours_amp=(--precision bf16); peer_amp=(--amp) ;;
    *) echo "case '$c': PRECISION must be fp32 or bf16, not '$precision'" >&2; exit 2 ;;
  esac
  two=(); peer2=(); one=(); prof=(); before=(); rss=(); peer_rss=(); bound=(); compiled=(); peer_before=()
  for ((i = 1; i <= runs; i++)); do
    if [[ -n ${BEFORE:-} ]]; then
      b=$(ours_run "$BEFORE" $ranks "$model" "$limit" "$batch" "${ours_amp[@]}"); echo "$c before   run $i: $b"
      before+=("$(field samples_per_s <<<"$b")")
    fi
    o=$(ours_run build/lockstep $ranks "$model" "$limit" "$batch" "${ours_amp[@]}")
    echo "$c lockstep run $i: $o"
    port=$((port + 1))
    p=$(cd "$peer" && OMP_NUM_THREADS=1 N=$ranks PORT=$port ./run_ddp.sh --model "$model" --epochs 1 --limit "$limit" \
          --batch "$batch" --lr $lr "${peer_amp[@]}")
    echo "$c peer     run $i: $p"
    if [[ -n ${COMPILE:-} ]]; then
      port=$((port + 1))
      q=$(cd "$peer" && OMP_NUM_THREADS=1 N=$ranks PORT=$port ./run_ddp.sh --model "$model" --epochs 1 --limit "$limit" \
            --batch "$batch" --lr $lr "${peer_amp[@]}" --compile)
      echo "$c compiled run $i: $q"; compiled+=("$(field samples_per_s <<<"$q")")
    fi
    if [[ -n ${PEER_BEFORE:-} ]]; then
      port=$((port + 1))
      q=$(cd "$peer" && OMP_NUM_THREADS=1 N=$ranks PORT=$port PEER_PY=$PEER_BEFORE ./run_ddp.sh --model "$model" \
            --epochs 1 --limit "$limit" --batch "$batch" --lr $lr "${peer_amp[@]}")
      echo "$c peer-before run $i: $q"; peer_before+=("$(field samples_per_s <<<"$q")")
    fi
    s=$(ours_run build/lockstep 1 "$model" "$limit" "$batch" "${ours_amp[@]}")
    echo "$c single   run $i: $s"
    two+=("$(field samples_per_s <<<"$o")"); peer2+=("$(field samples_per_s <<<"$p")")
    one+=("$(field samples_per_s <<<"$s")")
    rss+=("$(field peak_rss_mib <<<"$o")"); peer_rss+=("$(field peak_rss_mib <<<"$p")")
    if [[ -n ${PROFILE:-} ]]; then
      q=$(ours_run build/lockstep 1 "$model" "$limit" "$batch" "${ours_amp[@]}" --profile)
      echo "$c profiled run $i: $q"; prof+=("$(field samples_per_s <<<"$q")")
    fi
    if [[ -n ${BOUND:-} ]]; then
      ours_run build/lockstep 1 "$model" $((limit / 2)) "$batch" "${ours_amp[@]}" >"$tmp.a" &
      ours_run build/lockstep 1 "$model" $((limit / 2)) "$batch" "${ours_amp[@]}" >"$tmp.b"
      wait
      u=$(awk -v a="$(field samples_per_s <"$tmp.a")" -v b="$(field samples_per_s <"$tmp.b")" 'BEGIN {print a + b}')
      echo "$c 2 x independent run $i: $u samples/s"; bound+=("$u")
    fi
  done
  m2=$(printf '%s\n' "${two[@]}" | median); mp=$(printf '%s\n' "${peer2[@]}" | median)
  m1=$(printf '%s\n' "${one[@]}" | median)
  r=$(printf '%s\n' "${rss[@]}" | median); pr=$(printf '%s\n' "${peer_rss[@]}" | median)
  table+=$'\n'"| $model | $precision | $limit | $batch | $m2 | $mp | $(ratio "$m2" "$mp")x | $m1 | $(ratio "$m2" "$m1")x | $r / $pr |"
  if [[ -n ${PROFILE:-} ]]; then
    mq=$(printf '%s\n' "${prof[@]}" | median)
    extra+="$c: single process $m1 samples/s, with --profile $mq: overhead $(awk -v a="$mq" -v b="$m1" 'BEGIN {printf "%.1f", 100 * (1 - a / b)}')%"$'\n'
  fi
  if [[ -n ${BOUND:-} ]]; then
    mu=$(printf '%s\n' "${bound[@]}" | median)
    extra+="$c: two independent processes $mu samples/s: bound/single $(ratio "$mu" "$m1")x, 2 ranks reach $(ratio "$m2" "$mu")x of it"$'\n'
  fi
  if [[ -n ${COMPILE:-} ]]; then
    mc=$(printf '%s\n' "${compiled[@]}" | median)
    extra+="$c: peer with torch.compile $mc samples/s: lockstep 2 ranks / it $(ratio "$m2" "$mc")x"$'\n'
  fi
  if [[ -n ${PEER_BEFORE:-} ]]; then
    mo=$(printf '%s\n' "${peer_before[@]}" | median)
    extra+="$c: peer on $PEER_BEFORE $mo samples/s: lockstep 2 ranks / it $(ratio "$m2" "$mo")x"$'\n'
  fi
  if [[ -n ${BEFORE:-} ]]; then
    mb=$(printf '%s\n' "${before[@]}" | median)
    extra+="$c: before $mb samples/s, after/before $(ratio "$m2" "$mb")x"$'\n'
  fi
done
echo
echo "medians of $runs alternating runs"
bench/machine.sh "bench/ddp_vs_peer.sh $runs ${cases[*]}"
echo "$table"
[[ -z $extra ]] || printf '%s' "$extra"
