#!/usr/bin/env bash
# Encoding the fortunes corpus: lockstep's tokenizer (C++, one thread) beside Hugging Face's own
# tokenizers (PyPI, Rust; one text at a time, RAYON_NUM_THREADS=1), with the same tokenizer.json, the same
# 15k entries (one per fortune, see TextCorpusFormat::kFortunes) and identical ids (the oracle test).
# Each side times only its encoding loop (files read and parsed before the clock starts; lockstep's
# printing and Python's start-up excluded). Runs alternate (lockstep, tokenizers, ...) so machine
# noise hits both; prints every run's JSON, the medians and their ratio, for BPE and WordPiece.
# Usage: bench/tokenize.sh [RUNS=5] [VOCAB=8000]  (after make build; needs scripts/bootstrap --test)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}; vocab=${2:-8000}
lockstep=${LOCKSTEP:-build/lockstep}
corpus=/usr/share/games/fortunes
oracle=tests/tokenizer
[[ -d $corpus ]] || { echo "needs Debian's fortunes (scripts/bootstrap)" >&2; exit 1; }
py=${PYTHON:-$PWD/.venv/bin/python}
"$py" -c 'import tokenizers' 2>/dev/null || { echo "needs tokenizers in $py (scripts/bootstrap --test)" >&2; exit 1; }
[[ -x $lockstep ]] || { echo "no $lockstep: build it first (make -C build lockstep_cli)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": *\([0-9.e-]*\).*/\1/p"; }

bench/machine.sh "bench/tokenize.sh $*"
for model in bpe wordpiece; do
  "$lockstep" tokenize train --model $model --vocab-size "$vocab" --corpus $corpus --corpus-format fortunes \
    --out "$tmp/$model.json" >&2
  : >"$tmp/ours"; : >"$tmp/theirs"
  for ((i = 1; i <= runs; ++i)); do
    ours=$("$lockstep" tokenize encode --tokenizer "$tmp/$model.json" --corpus-format fortunes --report-time $corpus 2>&1 >/dev/null)
    theirs=$("$py" $oracle/oracle.py time "$tmp/$model.json" $corpus)
    echo "$model run $i: lockstep $ours  tokenizers $theirs"
    echo "$ours" | field seconds >>"$tmp/ours"
    echo "$theirs" | field seconds >>"$tmp/theirs"
    [[ $(echo "$ours" | field tokens) == $(echo "$theirs" | field tokens) ]] ||
      { echo "token counts differ: the two did not encode the same thing" >&2; exit 1; }
  done
  m_ours=$(median <"$tmp/ours"); m_theirs=$(median <"$tmp/theirs")
  awk -v m="$model" -v a="$m_ours" -v b="$m_theirs" -v n="$runs" \
    'BEGIN {printf "%s: median of %d runs: lockstep %.3f s, tokenizers %.3f s (%.1fx)\n", m, n, a, b, b / a}'
done
