"""What the language-model head costs at padding positions: one training step of gpt-mini
(tests/python/gpt_mini.py) on a (B, 128) batch whose rows have the real lengths of a fixed fortunes
batch, with the output layer and the loss over every (B, T) position (what lockstep and the peer
both do today) or only over the positions whose target is real (the same loss, the same gradients).
One process, one thread; each variant in its own process so its peak RSS is its own.

Usage: .venv/bin/python bench/gpt_mini_head_ab.py [--batch 100] [--real 0.42] [--steps 3]
       (--variant full|real runs one variant and prints its JSON line; without it both run, alternating)
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from gpt_mini import GptMini  # noqa: E402
from gpt_mini_peer import init_like_lockstep  # noqa: E402


def hidden(model, ids):
    """The final LayerNorm's output (B, T, C): the model without its output layer."""
    key_mask = ids != model.pad_id
    x = model.wte(ids) + model.wpe(torch.arange(ids.shape[1]))[None]
    for block in model.h:
        x = block(x, key_mask)
    return model.ln_f(x)


def run(a):
    torch.manual_seed(0)
    V, T, pad = 4001, 128, 4000
    model = GptMini(V, T, 256, 4, 4, pad_id=pad)
    init_like_lockstep(model, 4)
    # Row lengths uniform in [1, 2 x real x T]: about a share `real` of the positions are real.
    lengths = torch.clamp((torch.rand(a.batch) * 2 * a.real * T).long() + 1, max=T)
    lengths[0] = T  # the longest entry sets the batch's length
    ids = torch.randint(0, V - 1, (a.batch, T))
    y = torch.randint(0, V - 1, (a.batch, T))
    for b, n in enumerate(lengths.tolist()):
        ids[b, n:] = pad
        y[b, n:] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        h = hidden(model, ids)
        if a.variant == "full":
            logits = F.linear(h, model.wte.weight)  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=-100)
        else:
            real = y.reshape(-1) != -100
            logits = F.linear(h.reshape(-1, h.size(-1))[real], model.wte.weight)  # (real tokens, V)
            loss = F.cross_entropy(logits, y.reshape(-1)[real])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(round(loss.item(), 6))
    print(json.dumps({"variant": a.variant, "batch": a.batch, "real_fraction": round(float((y != -100).float().mean()), 3),
                      "step_s": sorted(times)[len(times) // 2], "losses": losses,
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--real", type=float, default=0.42)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--variant", choices=["full", "real"])
    a = p.parse_args()
    if a.variant:
        run(a)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for variant in ("full", "real", "full", "real"):
        subprocess.run([sys.executable, __file__, "--batch", str(a.batch), "--real", str(a.real), "--steps", str(a.steps),
                        "--variant", variant], env=env, check=True)


if __name__ == "__main__":
    main()
