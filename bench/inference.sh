#!/usr/bin/env bash
# Inference latency and throughput, LibTorch (fp32, bf16 autocast) against ONNX Runtime on the same
# weights exported by `lockstep export`, at batch 1 and 64 and with 1 and 2 intra-op threads, all in
# one run. LibTorch is timed by `lockstep predict` (per-batch forward, after 2 warmup batches);
# ONNX Runtime by bench/inference_ort.py (the venv's onnxruntime, same batches, same warmup). Prints a
# Markdown table for docs/inference.md: p50/p90/p99 ms per batch and samples/s.
# The weights come from a short synthetic training run (latency does not depend on their values),
# or from WEIGHTS=file. Inputs: the Fashion-MNIST test split for the 28x28 models, synthetic images
# for resnet18.
# Usage: [ROUNDS=3] bench/inference.sh [MODEL=convnet] [SAMPLES=2048]   (after make build and scripts/bootstrap --test)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-convnet}; samples=${2:-2048}
cli=${LOCKSTEP:-build/lockstep}
[[ -x $cli ]] || { echo "no $cli: run make build first" >&2; exit 1; }
py=${PYTHON:-$PWD/.venv/bin/python}
"$py" -c 'import onnxruntime' 2>/dev/null || { echo "onnxruntime missing in $py: run scripts/bootstrap --test" >&2; exit 1; }
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
# Every configuration runs ROUNDS times, the runtimes alternating within each round; the table
# gives each figure's median over the rounds.
rounds=${ROUNDS:-3}
results=$work/results   # lines: runtime|precision|batch|threads p50 p90 p99 samples/s
record() {  # KEY JSON
  echo "$1 $(field p50 <<<"$2") $(field p90 <<<"$2") $(field p99 <<<"$2") $(field throughput_samples_per_s <<<"$2")" >>"$results"
}

echo "model $model, $samples samples per configuration, $rounds rounds (medians)"
bench/machine.sh "ROUNDS=$rounds bench/inference.sh $model $samples"
echo
for round in $(seq "$rounds"); do
  for batch in 1 64; do
    # At least 10 timed batches of each size, after the 2 warmup ones.
    n=$(( samples > (batch * 12) ? samples : batch * 12 ))
    batches=$(( n / batch - 2 ))
    for threads in 1 2; do
      for precision in fp32 bf16; do
        j=$(OMP_NUM_THREADS=$threads "$cli" predict --model "$model" --weights "$weights" "${data[@]}" --split test \
              --limit "$n" --batch-size "$batch" --threads "$threads" --precision "$precision" --json | grep -o '{.*}')
        record "LibTorch|$precision|$batch|$threads" "$j"
      done
      record "ONNX_Runtime|fp32|$batch|$threads" "$("$py" bench/inference_ort.py "$work/model.onnx" "$shape" "$batch" "$threads" "$batches")"
    done
  done
done
echo '| runtime      | prec | batch | threads | p50 (ms) | p90 (ms) | p99 (ms) | samples/s  |'
echo '|--------------|------|-------|---------|----------|----------|----------|------------|'
# Medians per configuration, in the order the configurations first ran.
awk '
  { key = $1; if (!(key in count)) order[++keys] = key
    n = ++count[key]; for (f = 2; f <= 5; ++f) v[key, f, n] = $f }
  function median(key, f,   n, i, j, t, a) {
    n = count[key]; for (i = 1; i <= n; ++i) a[i] = v[key, f, i]
    for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j-1] > a[j]; --j) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
    return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
  END { for (k = 1; k <= keys; ++k) { split(order[k], p, "|"); gsub("_", " ", p[1])
          printf "| %-12s | %-4s | %5s | %7s | %8.3f | %8.3f | %8.3f | %10.0f |\n", p[1], p[2], p[3], p[4],
                 median(order[k], 2), median(order[k], 3), median(order[k], 4), median(order[k], 5) } }
' FS=' ' "$results"
