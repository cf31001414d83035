#!/usr/bin/env bash
# `lockstep plan` against what the runs measure: for each configuration below, the plan's peak per
# rank (lockstep plan --json) beside the peak RSS each rank of the same run reports (lockstep
# train's summary: getrusage's ru_maxrss of its process), and the error (planned / measured - 1).
# Every strategy, fp32 and bf16 at O1 and O2, the four reference models, 1 and 2 ranks, with and
# without activation checkpointing. One epoch over a small --limit keeps each run short; the
# held-out split is still evaluated (evaluation is one of the planned moments).
#
#   bench/memory_plan_validate.sh                 # LOCKSTEP=build/lockstep by default
#   ONLY=resnet18 bench/memory_plan_validate.sh   # the configurations whose name contains it
set -euo pipefail
cd "$(dirname "$0")/.."
LOCKSTEP=${LOCKSTEP:-build/lockstep}
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
ONLY=${ONLY:-}

# name | ranks | the run's flags (the same for plan and train)
CONFIGS=(
  "convnet local fp32 fashion-mnist|1|--model convnet --limit 1000"
  "convnet local bf16 O1|1|--model convnet --data synthetic --limit 500 --precision bf16 --opt-level O1"
  "convnet local bf16 O2|1|--model convnet --data synthetic --limit 500 --precision bf16 --opt-level O2"
  "convnet ddp fp32 ckpt|2|--model convnet --data synthetic --limit 1000 --strategy ddp --checkpoint-activations"
  "convnet zero1 fp32|2|--model convnet --data synthetic --limit 1000 --strategy zero1"
  "convnet zero2 bf16 O1|2|--model convnet --data synthetic --limit 1000 --strategy zero2 --precision bf16 --opt-level O1"
  "convnet fsdp fp32|2|--model convnet --data synthetic --limit 1000 --strategy fsdp"
  "convnet pipeline fp32|2|--model convnet --data synthetic --limit 1000 --strategy pipeline --micro-batches 4"
  "mlp-wide local fp32|1|--model mlp-wide --data synthetic --limit 500"
  "mlp-wide local adam ckpt|1|--model mlp-wide --data synthetic --limit 500 --optimizer adam --checkpoint-activations"
  "mlp-wide ddp bf16 O2|2|--model mlp-wide --data synthetic --limit 1000 --strategy ddp --precision bf16 --opt-level O2"
  "mlp-wide zero2 fp32|2|--model mlp-wide --data synthetic --limit 1000 --strategy zero2"
  "mlp-wide fsdp bf16 O1|2|--model mlp-wide --data synthetic --limit 1000 --strategy fsdp --precision bf16 --opt-level O1"
  "mlp-wide pipeline fp32 1f1b|2|--model mlp-wide --data synthetic --limit 1000 --strategy pipeline --micro-batches 4 --schedule 1f1b"
  "resnet18 local fp32|1|--model resnet18 --data synthetic --limit 64 --batch-size 32"
  "resnet18 local fp32 ckpt|1|--model resnet18 --data synthetic --limit 64 --batch-size 32 --checkpoint-activations"
  "resnet18 zero1 bf16 O1|2|--model resnet18 --data synthetic --limit 64 --batch-size 16 --strategy zero1 --precision bf16 --opt-level O1"
  "resnet18 fsdp fp32|2|--model resnet18 --data synthetic --limit 64 --batch-size 16 --strategy fsdp"
  "gpt-mini local fp32|1|--model gpt-mini --data fortunes --limit 400 --batch-size 16 --max-length 64"
  "gpt-mini ddp bf16 O1|2|--model gpt-mini --data fortunes --limit 400 --batch-size 16 --max-length 64 --strategy ddp --precision bf16 --opt-level O1"
  "gpt-mini zero2 fp32 ckpt|2|--model gpt-mini --data fortunes --limit 400 --batch-size 16 --max-length 64 --strategy zero2 --checkpoint-activations"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include apps || echo ' (with uncommitted changes)')"
echo "command: $0${ONLY:+ (ONLY=$ONLY)}"
echo
printf '| %-34s | %4s | %-15s | %13s | %12s | %7s |\n' configuration rank "peak moment" "planned (MiB)" "peak RSS (MiB)" error
printf '|%s|%s|%s|%s|%s|%s|\n' ------------------------------------ ------ ----------------- --------------- -------------- ---------
worst=0
for config in "${CONFIGS[@]}"; do
  IFS='|' read -r name ranks flags <<<"$config"
  [[ -n "$ONLY" && "$name" != *"$ONLY"* ]] && continue
  # shellcheck disable=SC2086
  $LOCKSTEP plan $flags --world-size "$ranks" --json >"$work/plan.json"
  if [[ "$ranks" == 1 ]]; then
    # shellcheck disable=SC2086
    $LOCKSTEP train $flags --epochs 1 --quiet | tail -n 1 >"$work/run.json"
  else
    # shellcheck disable=SC2086
    $LOCKSTEP run --nproc-per-node "$ranks" -- $LOCKSTEP train $flags --epochs 1 --quiet \
      | sed -n 's/^\[rank 0\] \({.*\)$/\1/p' | tail -n 1 >"$work/run.json"
  fi
  error=$($PY - "$work/plan.json" "$work/run.json" "$name" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1]))
run = json.load(open(sys.argv[2]))
measured = {r["rank"]: r["peak_rss_mib"] for r in run.get("ranks", [])} or {0: run["peak_rss_mib"]}
worst = 0.0
for r in plan["ranks"]:
    planned = r["peak"] / 2**20
    error = planned / measured[r["rank"]] - 1
    worst = max(worst, abs(error))
    print(f'| {sys.argv[3]:<34} | {r["rank"]:>4} | {r["peak_moment"]:<15} | {planned:>13.1f} | {measured[r["rank"]]:>14.1f} | {100 * error:>+6.1f}% |', file=sys.stderr)
print(f"{worst:.4f}")
EOF
  )
  worst=$($PY -c "print(max($worst, $error))")
done 2>&1
echo
echo "worst error: $($PY -c "print(f'{100 * $worst:.1f}%')")"
