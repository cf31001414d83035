"""gpt-mini in plain PyTorch: the module lockstep's models::GptMini mirrors, key for key.

Used by tests: `python3 gpt_mini.py STATE_DICT_FILE HEADS PAD_ID IDS_JSON` loads a state dict written
by lockstep (--save-model or models::save_state_dict) strictly into this module (the sizes come from
the tensors), runs it in eval mode on the (B, T) token ids IDS_JSON and prints one JSON line: the
state_dict keys in order and the logits, for the C++ side to compare.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x, key_mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        # A query sees the real keys at or before it, and itself.
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        allowed = (causal & key_mask[:, None, :]) | torch.eye(T, dtype=torch.bool)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x, key_mask):
        x = x + self.attn(self.ln_1(x), key_mask)
        return x + self.mlp(self.ln_2(x))


class GptMini(nn.Module):
    def __init__(self, vocab, context, d, heads, layers, pad_id=-1, num_classes=0, tie=True):
        super().__init__()
        self.pad_id = pad_id
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = None if tie else nn.Linear(d, vocab, bias=False)
        self.score = nn.Linear(d, num_classes, bias=False) if num_classes > 0 else None

    def forward(self, ids):
        key_mask = ids != self.pad_id if self.pad_id >= 0 else torch.ones_like(ids, dtype=torch.bool)
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))[None]
        for block in self.h:
            x = block(x, key_mask)
        x = self.ln_f(x)
        if self.score is not None:
            last = (key_mask.sum(1) - 1).clamp(min=0)
            return self.score(x[torch.arange(x.shape[0]), last])
        return F.linear(x, self.wte.weight if self.lm_head is None else self.lm_head.weight)


def from_state_dict(state, heads, pad_id):
    vocab, d = state["wte.weight"].shape
    layers = len({k.split(".")[1] for k in state if k.startswith("h.")})
    num_classes = state["score.weight"].shape[0] if "score.weight" in state else 0
    model = GptMini(vocab, state["wpe.weight"].shape[0], d, heads, layers, pad_id, num_classes,
                    tie="lm_head.weight" not in state)
    model.load_state_dict(state, strict=True)
    return model.eval()


def main():
    state = torch.load(sys.argv[1])
    model = from_state_dict(state, int(sys.argv[2]), int(sys.argv[3]))
    ids = torch.tensor(json.loads(sys.argv[4]), dtype=torch.long)
    with torch.no_grad():
        logits = model(ids)
    print(json.dumps({"keys": list(model.state_dict().keys()), "shape": list(logits.shape),
                      "logits": logits.flatten().tolist()}))


if __name__ == "__main__":
    main()
