#!/usr/bin/env bash
# gpt-mini on the fortunes corpus, 2 ranks (ddp over Gloo): held-out perplexity after training
# with length-bucketed batches (--max-tokens) against the same run with fixed-size batches of the
# same mean number of sequences (--batch-size), and both against the unigram baseline (add-one
# smoothed token frequencies of the training split, the perplexity a model that ignores context
# gets). Prints each run's summary, then per batching: median train_s, its held-out perplexity,
# the unigram perplexity and the padding fraction of its batches. Runs alternate (bucketed,
# fixed, ...) so machine noise hits both. Each run trains its BPE tokenizer on the training split
# before the clock starts (the same tokenizer every time: training is deterministic).
# Usage: bench/text_lm.sh [RUNS=3] [EPOCHS=2] [LIMIT=0 (all entries)] [MAX_TOKENS=2048]
#        (after make build; needs Debian's fortunes)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; epochs=${2:-2}; limit=${3:-0}; max_tokens=${4:-2048}
lockstep=${LOCKSTEP:-build/lockstep}
corpus=/usr/share/games/fortunes
[[ -d $corpus ]] || { echo "needs Debian's fortunes (scripts/bootstrap)" >&2; exit 1; }
[[ -x $lockstep ]] || { echo "no $lockstep: build it first (make -C build lockstep_cli)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p"; }
common=(train --quiet --model gpt-mini --data fortunes --task lm --limit "$limit" --epochs "$epochs"
        --max-length 128 --optimizer adamw --lr 0.001 --seed 0)

# Fixed-size batches hold the mean number of sequences of a bucketed batch: tokens per batch /
# mean tokens per sequence, from the bucketed run's own figures (padding counted).
run() { "$lockstep" run --nproc-per-node 2 -- "$lockstep" "${common[@]}" "$@" |
        sed -n 's/^\[rank 0\] \({.*\)/\1/p'; }
: >"$tmp/bucketed"; : >"$tmp/fixed"
for ((i = 1; i <= runs; ++i)); do
  b=$(run --max-tokens "$max_tokens"); echo "bucketed run $i: $b"; echo "$b" >>"$tmp/bucketed"
  batch=$(echo "$b" | field mean_batch_sequences); batch=${batch%.*}; batch=$(( batch > 0 ? batch : 1 ))
  f=$(run --batch-size "$batch"); echo "fixed (batch $batch) run $i: $f"; echo "$f" >>"$tmp/fixed"
done
bench/machine.sh "bench/text_lm.sh $runs $epochs $limit $max_tokens"
for kind in bucketed fixed; do
  t=$(field train_s <"$tmp/$kind" | median); p=$(field perplexity <"$tmp/$kind" | median)
  u=$(field unigram_perplexity <"$tmp/$kind" | head -1); pad=$(field padding_fraction <"$tmp/$kind" | median)
  echo "$kind: median of $runs runs: train_s $t, held-out perplexity $p (unigram $u), padding fraction $pad"
done
