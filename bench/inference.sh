#!/usr/bin/env bash
# Inference latency and throughput, LibTorch (fp32, bf16 autocast) against ONNX Runtime on the same
# weights exported by `lockstep export`, at batch 1 and 64 and with 1 and 2 intra-op threads, all in
# one run. LibTorch is timed by `lockstep predict` (per-batch forward, after 2 warmup batches);
# ONNX Runtime by bench/inference_ort.js (onnxruntime-node, same batches, same warmup). Prints a
# Markdown table for docs/inference.md: p50/p90/p99 ms per batch and samples/s.
# The weights come from a short synthetic training run (latency does not depend on their values),
# or from WEIGHTS=file. Inputs: the Fashion-MNIST test split for the 28x28 models, synthetic images
# for resnet18.
# Usage: bench/inference.sh [MODEL=convnet] [SAMPLES=2048]   (after make build and scripts/bootstrap --test)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-convnet}; samples=${2:-2048}
cli=${LOCKSTEP:-build/lockstep}
[[ -x $cli ]] || { echo "no $cli: run make build first" >&2; exit 1; }
[[ -d tests/export/node_modules/onnxruntime-node ]] ||
  { echo "onnxruntime-node missing: run scripts/bootstrap --test" >&2; exit 1; }
case $model in
  resnet18) shape=3,32,32; data=(--data synthetic) ;;
  mlp|convnet) shape=1,28,28; data=() ;;
  *) echo "MODEL must be mlp, convnet or resnet18, not '$model'" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
weights=${WEIGHTS:-}
if [[ -z $weights ]]; then
  weights=$work/weights.pt
  "$cli" train --quiet --model "$model" --data synthetic --limit 200 --batch-size 50 --save-model "$weights" >/dev/null
fi
"$cli" export --model "$model" --weights "$weights" --out "$work/model.onnx" >/dev/null

field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }
row() {  # RUNTIME PRECISION BATCH THREADS JSON
  local j=$5 p50 p90 p99 tput
  p50=$(field p50 <<<"$j"); p90=$(field p90 <<<"$j"); p99=$(field p99 <<<"$j")
  tput=$(field throughput_samples_per_s <<<"$j")
  printf '| %-12s | %-4s | %5s | %7s | %8.3f | %8.3f | %8.3f | %10.0f |\n' "$1" "$2" "$3" "$4" "$p50" "$p90" "$p99" "$tput"
}

echo "model $model, $samples samples per configuration, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "command: bench/inference.sh $model $samples"
echo
echo '| runtime      | prec | batch | threads | p50 (ms) | p90 (ms) | p99 (ms) | samples/s  |'
echo '|--------------|------|-------|---------|----------|----------|----------|------------|'
for batch in 1 64; do
  # At least 10 timed batches of each size, after the 2 warmup ones.
  n=$(( samples > (batch * 12) ? samples : batch * 12 ))
  batches=$(( n / batch - 2 ))
  for threads in 1 2; do
    for precision in fp32 bf16; do
      j=$(OMP_NUM_THREADS=$threads "$cli" predict --model "$model" --weights "$weights" "${data[@]}" --split test \
            --limit "$n" --batch-size "$batch" --threads "$threads" --precision "$precision" --json | grep -o '{.*}')
      row LibTorch "$precision" "$batch" "$threads" "$j"
    done
    j=$(node bench/inference_ort.js "$work/model.onnx" "$shape" "$batch" "$threads" "$batches")
    row "ONNX Runtime" fp32 "$batch" "$threads" "$j"
  done
done
