#!/usr/bin/env bash
# gpt-mini against the Python peer (bench/gpt_mini_peer.py: PyTorch's own DDP on Gloo), side by side
# in one run: a language model on Debian's fortunes, 2 ranks x 1 intra-op thread, the first LIMIT
# training entries, fixed batches of BATCH sequences per rank, context 128, AdamW lr 1e-3, seed 0.
# Both sides get the same tokenizer ids, the same batches and the same initial weights:
#   - one tokenizer.json (a byte-level BPE of 4000 tokens trained on the corpus by `lockstep tokenize
#     train`, plus <|endoftext|> and <pad>): lockstep reads it with --tokenizer, the peer reads the ids
#     `lockstep tokenize encode` gives every entry (Python has no `tokenizers` package here);
#   - the peer's --plan cuts the batches as DistributedSampler does on each rank and writes GPT-2
#     initialised weights, which lockstep loads with --init-weights and the peer with --init-weights.
# So the two runs train the same function on the same batches from the same point: the script checks
# it (rank 0's first step losses, as lockstep's --log-jsonl logs them and as the peer prints them,
# within 1e-4; the held-out loss of lockstep's saved weights computed by the peer within 1e-4 of what
# lockstep printed; both sides' padding fraction and target tokens) and stops if they differ.
# tokens/s = the epoch's target tokens (padding excluded, both ranks; the plan's count, which the
# peer's own count must equal) / rank 0's seconds in the training loop (evaluation excluded, as
# lockstep's train_s). Peak RSS per rank: getrusage's ru_maxrss on both sides.
# Runs alternate (lockstep, peer, lockstep, ...) so machine noise hits both; every run's JSON is
# printed, then bench/machine.sh's header and one table of medians and ratios.
# CKPT=1 adds a side, lockstep with --checkpoint-activations (each block's activations
# recomputed in backward instead of kept: less memory, one more forward), in the same rotation;
# BASE=path/to/another/lockstep adds that binary as a side (the before of a before/after).
# COMPILE=1 adds the peer with torch.compile (its compiling first step trained, not timed);
# PEER_BEFORE=PYTHON adds the peer run by another Python (/usr/bin/python3: Debian's torch 1.13).
# Usage: [CKPT=1] [BASE=lockstep] [COMPILE=1] [PEER_BEFORE=python] bench/gpt_mini_vs_peer.sh [RUNS=5] [LIMIT=2000] [BATCH=100] [EPOCHS=1]
#        LOCKSTEP=path/to/lockstep (default build/lockstep); needs the venv (scripts/bootstrap --test) and fortunes.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}; limit=${2:-2000}; batch=${3:-100}; epochs=${4:-1}
lockstep=${LOCKSTEP:-build/lockstep}
corpus=/usr/share/games/fortunes
py=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
[[ -d $corpus ]] || { echo "needs Debian's fortunes (scripts/bootstrap)" >&2; exit 1; }
[[ -x $lockstep ]] || { echo "no $lockstep: build it first (make -C build lockstep_cli)" >&2; exit 1; }
"$py" -c 'import torch' 2>/dev/null || { echo "needs $py with torch (scripts/bootstrap --test)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
field() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
# "ranks":[{"rank":0,"peak_rss_mib":X,...},{"rank":1,"peak_rss_mib":Y,...}] -> "X Y"
rank_rss() { grep -o '"peak_rss_mib":[0-9.]*' | sed 1d | cut -d: -f2 | tr '\n' ' '; }

# The tokenizer and every entry's ids (before the clock: neither side times its tokenisation).
printf '<|endoftext|>\n<pad>\n' >"$tmp/specials"
"$lockstep" tokenize train --corpus "$corpus" --corpus-format fortunes --vocab-size 4000 \
  --add-special-tokens "$tmp/specials" --out "$tmp/tokenizer.json" >/dev/null
"$lockstep" tokenize encode --tokenizer "$tmp/tokenizer.json" --corpus-format fortunes "$corpus" >"$tmp/ids"

peer_args=(--corpus "$corpus" --ids "$tmp/ids" --tokenizer "$tmp/tokenizer.json" --limit "$limit" --epochs "$epochs"
           --batch-size "$batch" --max-length 128 --lr 0.001 --seed 0)
plan=$(OMP_NUM_THREADS=1 "$py" bench/gpt_mini_peer.py "${peer_args[@]}" --plan --save-init "$tmp/init.pt")
echo "plan: $plan"
tokens=$(field target_tokens <<<"$plan"); plan_padding=$(field padding_fraction <<<"$plan")

ours() { side "$lockstep" "$@"; }
# One lockstep run of binary $1 on both ranks, with more train flags after it.
side() {
  local bin=$1; shift
  OMP_NUM_THREADS=1 "$bin" run --nproc-per-node 2 -- "$bin" train --quiet --model gpt-mini --data fortunes \
    --task lm --tokenizer "$tmp/tokenizer.json" --init-weights "$tmp/init.pt" --limit "$limit" --epochs "$epochs" \
    --batch-size "$batch" --max-length 128 --optimizer adamw --lr 0.001 --seed 0 --threads 1 \
    --log-jsonl "$tmp/steps.jsonl" --log-every 1 "$@" | sed -n 's/^\[rank 0\] \({.*\)/\1/p'
}
# One peer run on both ranks; $1: its rendezvous port (a fresh one each run), $2: the Python, then
# more peer flags.
peer() {
  local port=$1 python=$2; shift 2
  for r in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r OMP_NUM_THREADS=1 \
      "$python" bench/gpt_mini_peer.py "${peer_args[@]}" --init-weights "$tmp/init.pt" "$@" &
  done
  wait
}
# Keeps another peer run's figures ($2, its JSON) in the arrays of side $1 (compiled, before), after
# checking its first step losses against the peer's ($3).
keep_peer() {
  local -n s=${1}_s tps=${1}_tps rss0=${1}_rss0 rss1=${1}_rss1
  local d; d=$(max_diff "$(sed -n 's/.*"first_losses": \[\([^]]*\)\].*/\1/p' <<<"$2" | tr -d ',')" "$3")
  echo "check run $i: $1's first step losses differ from the peer's by at most $d"
  within "$d" 1e-4 || { echo "$1 differs from the peer by $d > 1e-4: not the same function" >&2; exit 1; }
  s+=("$(field train_s <<<"$2")"); tps+=("$(field tokens_per_s <<<"$2")")
  local a b; read -r a b <<<"$(sed -n 's/.*"peak_rss_mib_ranks": \[\([^]]*\)\].*/\1/p' <<<"$2" | tr -d ',')"
  rss0+=("$a"); rss1+=("$b")
}
# The largest |a_i - b_i| over two lists of numbers.
max_diff() { paste <(tr ' ' '\n' <<<"$1") <(tr ' ' '\n' <<<"$2") | awk 'NF == 2 {d = $1 - $2; d = d < 0 ? -d : d; if (d > m) m = d} END {printf "%.2g", m}'; }
within() { awk -v d="$1" -v t="$2" 'BEGIN {exit !(d <= t)}'; }

ours_tps=(); peer_tps=(); ours_rss0=(); ours_rss1=(); peer_rss0=(); peer_rss1=(); ours_s=(); peer_s=()
ckpt_tps=(); ckpt_rss0=(); ckpt_rss1=(); ckpt_s=(); base_tps=(); base_rss0=(); base_rss1=(); base_s=()
compiled_tps=(); compiled_rss0=(); compiled_rss1=(); compiled_s=(); before_tps=(); before_rss0=(); before_rss1=(); before_s=()
# Keeps a lockstep run's figures ($2, its JSON) in the arrays of side $1 (ours, ckpt, base).
keep() {
  local -n s=${1}_s tps=${1}_tps rss0=${1}_rss0 rss1=${1}_rss1
  s+=("$(field train_s <<<"$2")")
  tps+=("$(awk -v t="$tokens" -v s="$(field train_s <<<"$2")" 'BEGIN {printf "%.1f", t / s}')")
  local a b; read -r a b <<<"$(rank_rss <<<"$2")"; rss0+=("$a"); rss1+=("$b")
}
for ((i = 1; i <= runs; i++)); do
  rm -f "$tmp/steps.jsonl"
  save=(); ((i == 1)) && save=(--save-model "$tmp/trained.pt")
  o=$(ours "${save[@]}"); echo "lockstep run $i: $o"
  p=$(peer $((29811 + i)) "$py"); echo "peer     run $i: $p"
  # The same function on the same batches: compare, then time.
  ours_losses=$(grep '"event":"step"' "$tmp/steps.jsonl" | head -5 | field loss | tr '\n' ' ')
  peer_losses=$(sed -n 's/.*"first_losses": \[\([^]]*\)\].*/\1/p' <<<"$p" | tr -d ',')
  d_first=$(max_diff "$ours_losses" "$peer_losses")
  d_test=$(max_diff "$(field test_loss <<<"$o")" "$(field test_loss <<<"$p")")
  echo "check run $i: first step losses differ by at most $d_first, held-out loss after training by $d_test;" \
       "padding fraction lockstep $(field padding_fraction <<<"$o"), plan $plan_padding;" \
       "target tokens peer $(field target_tokens <<<"$p"), plan $tokens"
  within "$d_first" 1e-4 || { echo "the first step losses differ by $d_first > 1e-4: not the same function" >&2; exit 1; }
  [[ $(field padding_fraction <<<"$o") == "$plan_padding" ]] || { echo "lockstep's padding differs from the plan's: other batches" >&2; exit 1; }
  [[ $(field target_tokens <<<"$p") == "$tokens" ]] || { echo "the peer counted other tokens than the plan" >&2; exit 1; }
  if ((i == 1)); then
    e=$(OMP_NUM_THREADS=1 "$py" bench/gpt_mini_peer.py "${peer_args[@]}" --eval-weights "$tmp/trained.pt")
    d_saved=$(max_diff "$(field test_loss <<<"$o")" "$(field test_loss <<<"$e")")
    echo "check: lockstep's trained weights in the Python model: held-out loss $(field test_loss <<<"$e")," \
         "lockstep printed $(field test_loss <<<"$o") (differ by $d_saved)"
    within "$d_saved" 1e-4 || { echo "the Python model scores lockstep's weights differently: not the same function" >&2; exit 1; }
  fi
  if [[ -n ${CKPT:-} ]]; then
    rm -f "$tmp/steps.jsonl"
    c=$(ours --checkpoint-activations); echo "lockstep --checkpoint-activations run $i: $c"
    ckpt_losses=$(grep '"event":"step"' "$tmp/steps.jsonl" | head -5 | field loss | tr '\n' ' ')
    echo "check run $i: --checkpoint-activations' first step losses differ from the peer's by at most" \
         "$(max_diff "$ckpt_losses" "$peer_losses")"
    keep ckpt "$c"
  fi
  if [[ -n ${BASE:-} ]]; then
    rm -f "$tmp/steps.jsonl"
    b=$(side "$BASE"); echo "base $BASE run $i: $b"
    echo "check run $i: the base's first step losses differ from the peer's by at most" \
         "$(max_diff "$(grep '"event":"step"' "$tmp/steps.jsonl" | head -5 | field loss | tr '\n' ' ')" "$peer_losses")"
    keep base "$b"
  fi
  if [[ -n ${COMPILE:-} ]]; then
    c=$(peer $((29831 + i)) "$py" --compile); echo "peer --compile run $i: $c"
    keep_peer compiled "$c" "$peer_losses"
  fi
  if [[ -n ${PEER_BEFORE:-} ]]; then
    b=$(peer $((29851 + i)) "$PEER_BEFORE"); echo "peer $PEER_BEFORE run $i: $b"
    keep_peer before "$b" "$peer_losses"
  fi
  keep ours "$o"
  peer_s+=("$(field train_s <<<"$p")"); peer_tps+=("$(field tokens_per_s <<<"$p")")
  read -r a b <<<"$(sed -n 's/.*"peak_rss_mib_ranks": \[\([^]]*\)\].*/\1/p' <<<"$p" | tr -d ',')"; peer_rss0+=("$a"); peer_rss1+=("$b")
done

med() { printf '%s\n' "$@" | median; }
mo=$(med "${ours_tps[@]}"); mp=$(med "${peer_tps[@]}")
o0=$(med "${ours_rss0[@]}"); o1=$(med "${ours_rss1[@]}"); p0=$(med "${peer_rss0[@]}"); p1=$(med "${peer_rss1[@]}")
larger() { awk -v a="$1" -v b="$2" 'BEGIN {print (a > b) ? a : b}'; }
o_max=$(larger "$o0" "$o1"); p_max=$(larger "$p0" "$p1")
echo
echo "medians of $runs alternating runs; $tokens target tokens per epoch x $epochs (padding fraction $plan_padding)"
bench/machine.sh "${COMPILE:+COMPILE=1 }${PEER_BEFORE:+PEER_BEFORE=$PEER_BEFORE }bench/gpt_mini_vs_peer.sh $runs $limit $batch $epochs"
echo "| side | tokens/s (each run) | tokens/s | train s | peak RSS rank 0 / 1 MiB |"
echo "|---|---|---|---|---|"
echo "| lockstep | ${ours_tps[*]} | $mo | $(med "${ours_s[@]}") | $o0 / $o1 |"
echo "| peer (torch $("$py" -c 'import torch; print(torch.__version__)')) | ${peer_tps[*]} | $mp | $(med "${peer_s[@]}") | $p0 / $p1 |"
for side in compiled before; do
  declare -n side_tps=${side}_tps side_s=${side}_s side_rss0=${side}_rss0 side_rss1=${side}_rss1
  ((${#side_tps[@]})) || continue
  name="peer --compile"; [[ $side == before ]] && name="peer (torch $("$PEER_BEFORE" -c 'import torch; print(torch.__version__)'))"
  echo "| $name | ${side_tps[*]} | $(med "${side_tps[@]}") | $(med "${side_s[@]}") | $(med "${side_rss0[@]}") / $(med "${side_rss1[@]}") |"
  echo "lockstep / $name: tokens/s $(ratio "$mo" "$(med "${side_tps[@]}")")x" >>"$tmp/ratios"
done
if [[ -n ${CKPT:-} ]]; then
  mc=$(med "${ckpt_tps[@]}"); c0=$(med "${ckpt_rss0[@]}"); c1=$(med "${ckpt_rss1[@]}")
  echo "| lockstep --checkpoint-activations | ${ckpt_tps[*]} | $mc | $(med "${ckpt_s[@]}") | $c0 / $c1 |"
fi
if [[ -n ${BASE:-} ]]; then
  mb=$(med "${base_tps[@]}"); b0=$(med "${base_rss0[@]}"); b1=$(med "${base_rss1[@]}")
  echo "| base ($BASE) | ${base_tps[*]} | $mb | $(med "${base_s[@]}") | $b0 / $b1 |"
fi
echo "lockstep / peer: tokens/s $(ratio "$mo" "$mp")x (target >= 1.25x), peak RSS (larger rank) $(ratio "$o_max" "$p_max")x (target <= 0.6x)"
[[ -f $tmp/ratios ]] && cat "$tmp/ratios"
if [[ -n ${BASE:-} ]]; then
  echo "base / peer: tokens/s $(ratio "$mb" "$mp")x, peak RSS (larger rank) $(ratio "$(larger "$b0" "$b1")" "$p_max")x"
fi
if [[ -n ${CKPT:-} ]]; then
  echo "lockstep --checkpoint-activations / peer: tokens/s $(ratio "$mc" "$mp")x, peak RSS (larger rank)" \
       "$(ratio "$(larger "$c0" "$c1")" "$p_max")x"
fi
