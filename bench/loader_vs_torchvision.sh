#!/usr/bin/env bash
# The data loader alone, lockstep against torchvision's ImageFolder + DataLoader (issue 31's bar:
# at least 1.5x the images/s at the same worker count). Two folders, written by
# tests/python/image_folders.py with PIL: Fashion-MNIST's first N_PNG training images as 28x28
# grey PNG files, and N_JPEG random-colour 3x64x64 JPEG files. Each is read for EPOCHS shuffled
# epochs in batches of 64 through the same transforms, at 0, 1 and 2 workers; runs alternate
# (lockstep, torchvision, lockstep, ...) and the table gives medians.
# PEER_BEFORE=PYTHON adds torchvision run by another Python (/usr/bin/python3: Debian's torch 1.13
# and python3-torchvision 0.14) to the rotation. (torch.compile has nothing to compile here: the
# DataLoader's work is PIL and Python, not a module.)
# Usage: [PEER_BEFORE=python] bench/loader_vs_torchvision.sh [RUNS=5] [N_PNG=10000] [N_JPEG=5000] [EPOCHS=2]  (after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}; n_png=${2:-10000}; n_jpeg=${3:-5000}; epochs=${4:-2}
py=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
for p in "$py" ${PEER_BEFORE:+"$PEER_BEFORE"}; do
  $p -c 'import torchvision' 2>/dev/null || { echo "needs $p with torchvision (scripts/bootstrap --test)" >&2; exit 1; }
done
version() { $1 -c 'import torch, torchvision; print(f"torchvision {torchvision.__version__}, torch {torch.__version__}")'; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": *\([0-9.]*\).*/\1/p"; }

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
$py tests/python/image_folders.py "$tmp" "$n_png" 0 "$n_jpeg" >/dev/null
declare -A sets=(
  [png]="$tmp/fmnist/train|Grayscale(), ToTensor(), Normalize((0.2860,), (0.3530,))"
  [png-augmented]="$tmp/fmnist/train|RandomCrop(28, padding=4), RandomHorizontalFlip(), Grayscale(), ToTensor(), Normalize((0.2860,), (0.3530,))"
  [jpeg]="$tmp/jpeg|RandomResizedCrop(56), RandomHorizontalFlip(), ToTensor(), Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))"
)
rows=()
for set in png png-augmented jpeg; do
  dir=${sets[$set]%%|*}; transform=${sets[$set]#*|}
  for workers in 0 1 2; do
    ours=(); peer=(); before=()
    for ((i = 1; i <= runs; i++)); do
      o=$(build/lockstep bench --loader --data-dir "$dir" --transform "$transform" --workers "$workers" \
            --batch-size 64 --epochs "$epochs" | grep -o '{.*}')
      p=$(OMP_NUM_THREADS=1 $py bench/loader_peer.py "$dir" "$transform" "$workers" 64 "$epochs")
      echo "$set, $workers workers, run $i: lockstep $o; torchvision $p"
      ours+=("$(field images_per_s <<<"$o")"); peer+=("$(field images_per_s <<<"$p")")
      if [[ -n ${PEER_BEFORE:-} ]]; then
        b=$(OMP_NUM_THREADS=1 $PEER_BEFORE bench/loader_peer.py "$dir" "$transform" "$workers" 64 "$epochs")
        echo "$set, $workers workers, run $i: torchvision before $b"
        before+=("$(field images_per_s <<<"$b")")
      fi
    done
    mo=$(printf '%s\n' "${ours[@]}" | median); mp=$(printf '%s\n' "${peer[@]}" | median)
    row="| $set | $workers | $(printf "%.0f" "$mo") | $(printf "%.0f" "$mp") | $(awk -v a="$mo" -v b="$mp" 'BEGIN {printf "%.2f", a / b}')x |"
    if [[ -n ${PEER_BEFORE:-} ]]; then
      mb=$(printf '%s\n' "${before[@]}" | median)
      row+=" $(printf "%.0f" "$mb") | $(awk -v a="$mo" -v b="$mb" 'BEGIN {printf "%.2f", a / b}')x |"
    fi
    rows+=("$row")
  done
done
echo
echo "medians of $runs alternating runs, images/s, batch 64, $epochs epochs"
bench/machine.sh "${PEER_BEFORE:+PEER_BEFORE=$PEER_BEFORE }bench/loader_vs_torchvision.sh $runs $n_png $n_jpeg $epochs"
echo "peer: $(version "$py")${PEER_BEFORE:+; before: $(version "$PEER_BEFORE")}"
if [[ -n ${PEER_BEFORE:-} ]]; then
  echo "| folder, transforms | workers | lockstep | torchvision DataLoader | vs torchvision | before: torchvision DataLoader | vs before |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| folder, transforms | workers | lockstep | torchvision DataLoader | vs torchvision |"
  echo "|---|---|---|---|---|"
fi
printf '%s\n' "${rows[@]}"
