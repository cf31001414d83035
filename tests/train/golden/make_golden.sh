#!/usr/bin/env bash
# Writes the golden files of Trainer.LocalStrategyRepeatsThePreSeamTrainerBitForBit from a
# `lockstep` binary (the test's options, one thread): every step's loss from --log-jsonl
# (--log-every 1) and a CRC-32 of each final parameter's raw bytes, computed by Python's zlib over
# torch.load's tensors (the test computes the same CRC with zlib in C++).
# Usage: tests/train/golden/make_golden.sh path/to/lockstep   (needs Debian's python3-torch)
set -euo pipefail
bin=$1; here=$(cd "$(dirname "$0")" && pwd); tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run() {  # NAME ARGS...
  local name=$1; shift
  "$bin" train --quiet --data synthetic --threads 1 --log-every 1 --log-jsonl "$tmp/$name.jsonl" \
      --save-model "$tmp/$name.pt" "$@" > /dev/null
  /usr/bin/python3 - "$tmp/$name.jsonl" "$tmp/$name.pt" "$here/$name.json" "$*" <<'PY'
import json, sys, zlib, torch
log, model, out, args = sys.argv[1:]
losses = [json.loads(l)["loss"] for l in open(log) if json.loads(l)["event"] == "step"]
crc = {k: zlib.crc32(v.contiguous().numpy().tobytes()) for k, v in torch.load(model).items()}
json.dump({"args": args, "step_losses": losses, "crc32": crc}, open(out, "w"), indent=1)
PY
}
run convnet_fp32_sgd --model convnet --limit 400 --batch-size 50 --epochs 2 --seed 8
run mlp_o2_accum_clip --model mlp --limit 240 --batch-size 20 --accum-steps 2 --seed 4 --precision bf16 \
    --opt-level O2 --loss-scale dynamic --clip-norm 1.0
