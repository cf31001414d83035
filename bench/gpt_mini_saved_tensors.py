"""Where gpt-mini's training memory goes: the tensors autograd saves for backward in one forward of a
(B, T) batch, by module, plus the largest transient tensors around the loss. Run with Debian's
/usr/bin/python3 (torch 1.13); the model is tests/python/gpt_mini.py, the same module lockstep's
models::GptMini is (the same ATen ops, so the same saved tensors).

Usage: .venv/bin/python bench/gpt_mini_saved_tensors.py [--batch 42] [--length 128] [--vocab 4001]
Prints one table (MiB, counting each storage once, in the module that first saved it) and one JSON
line with the totals.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from gpt_mini import GptMini  # noqa: E402

MIB = 1024.0 * 1024.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=42)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--vocab", type=int, default=4001)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    a = p.parse_args()

    torch.manual_seed(0)
    pad = a.vocab - 1
    model = GptMini(a.vocab, a.length, a.n_embd, a.n_head, a.n_layer, pad_id=pad)
    params = {t.data_ptr() for t in model.parameters()}
    x = torch.randint(0, a.vocab - 1, (a.batch, a.length))
    y = torch.randint(0, a.vocab - 1, (a.batch, a.length))

    # Attribute each saved storage to the innermost module running when it was saved.
    stack = ["(top)"]
    seen = set()
    by_module = OrderedDict()

    def pre(name):
        return lambda *_: stack.append(name)

    def post(*_):
        stack.pop()

    for name, m in model.named_modules():
        if name and not list(m.children()):
            m.register_forward_pre_hook(pre(name))
            m.register_forward_hook(post)
        elif name.count(".") == 1 and name.startswith("h."):  # a block's own ops (attention math)
            m.register_forward_pre_hook(pre(name + " (attention math, residuals)"))
            m.register_forward_hook(post)
        elif name.endswith(".attn"):
            m.register_forward_pre_hook(pre(name + " (scores, softmax, q k v)"))
            m.register_forward_hook(post)
        elif name.endswith(".mlp"):
            m.register_forward_pre_hook(pre(name + " (gelu)"))
            m.register_forward_hook(post)

    def pack(t):
        key = t.storage().data_ptr()
        if key not in seen and t.data_ptr() not in params and t.storage().data_ptr() not in params:
            seen.add(key)
            size = t.storage().nbytes()
            group = stack[-1]
            by_module[group] = by_module.get(group, 0) + size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x)
        stack.append("loss (log_softmax output)")
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
        stack.pop()

    logits_bytes = logits.numel() * logits.element_size()
    total = sum(by_module.values())
    # Folding the layers: h.0 .. h.N-1 of the same kind together.
    folded = OrderedDict()
    for k, v in by_module.items():
        kind = k
        if k.startswith("h."):
            kind = "h.* " + k.split(".", 2)[2] if k.count(".") >= 2 else "h.* " + k.split(" ", 1)[1]
        folded[kind] = folded.get(kind, 0) + v
    print(f"saved for backward, batch ({a.batch}, {a.length}), vocabulary {a.vocab}, "
          f"{a.n_layer} layers x {a.n_head} heads x d_model {a.n_embd} (MiB):")
    for k, v in sorted(folded.items(), key=lambda kv: -kv[1]):
        print(f"  {k:48s} {v / MIB:8.1f}")
    print(f"  {'total':48s} {total / MIB:8.1f}")
    print(f"one (B, T, V) fp32 tensor (logits, their log_softmax, or either's gradient): {logits_bytes / MIB:.1f} MiB")
    print(json.dumps({"batch": a.batch, "length": a.length, "vocab": a.vocab, "saved_mib": round(total / MIB, 1),
                      "logits_mib": round(logits_bytes / MIB, 1),
                      "saved_by_module_mib": {k: round(v / MIB, 1) for k, v in folded.items()}}))
    loss.backward()


if __name__ == "__main__":
    main()
