"""The Python peer of `lockstep train --model gpt-mini --data fortunes --task lm`: PyTorch's own DDP
on CPU/Gloo training the same gpt-mini (tests/python/gpt_mini.py, the module whose logits
tests/models/gpt_mini_test.cpp checks against lockstep's) on the same sequences in the same batches.

What a Python user writes, in ../shared/peer's style: one process per rank, started by hand
(Debian's torchrun 1.13 fails under Python 3.11), DistributedSampler + DataLoader, AdamW.

The same data as lockstep (see Note [Text training] in include/lockstep/train/text_data.h):
- entries: the fortune files of --corpus in name order, split at '%' lines; every 20th entry
  (index % 20 == 19) is held out, --limit takes the first N others with text, reading stops there;
- token ids: --ids, the output of `lockstep tokenize encode --corpus-format fortunes` for the whole
  corpus (one line per entry), with --tokenizer's <|endoftext|> and <pad> ids (Python has no
  `tokenizers` package here, so the peer reads the ids lockstep's tokenizer gives; tokenizer.json
  is Hugging Face's format, and lockstep's encoder is tested against tokenizers.js);
- a sequence is <eos> ids <eos>: input its first T tokens, target the next T (T <= --max-length),
  padded with <pad> to the batch's longest, target -100 at padding (cross_entropy ignores it);
- batches: --batch-size sequences cut from DistributedSampler's order (seed + epoch), as lockstep's
  fixed batches are.

Modes:
- --plan: no training; prints the batches' figures (target tokens, padded tokens, steps, padding
  fraction as lockstep reports it) and, with --save-init FILE, writes GPT-2-initialised weights
  (lockstep's init: N(0, 0.02), residual projections / sqrt(2 x layers)) for both sides to start
  from (lockstep: --init-weights FILE).
- training (1 or N ranks; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them): prints
  one JSON line from rank 0: tokens_per_s (target tokens, padding excluded, of all ranks / the
  training loop's seconds), samples_per_s, train_s, rank 0's first step losses (as lockstep's
  --log-jsonl logs them), the held-out loss and perplexity, each rank's peak RSS (MiB, getrusage).
- --compile: the DDP module through torch.compile (inductor, CPU), as a Python user chasing speed
  would run it; batch and length marked dynamic so it compiles once. Its first step (the compile) is
  trained but not timed: tokens_per_s counts the other steps' tokens over their seconds (compile_s
  printed); target_tokens stays the whole epoch's.
- --eval-weights FILE: no training; the held-out loss of a state dict lockstep wrote (--save-model),
  to compare with the test_loss lockstep printed for the same weights.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from gpt_mini import GptMini  # noqa: E402  (the module the C++ test compares logits with)

HELD_OUT_EVERY = 20
IGNORE_INDEX = -100
EVAL_BATCH = 32  # lockstep's evaluation batch
FIRST_LOSSES = 5  # steps whose loss the summary lists


def fortune_files(root):
    """The fortune files lockstep reads from a directory: regular files without an extension."""
    names = [n for n in os.listdir(root)
             if os.path.isfile(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n))
             and not os.path.splitext(n)[1]]
    return [os.path.join(root, n) for n in sorted(names)]


def fortune_entries(root):
    """Every entry in reading order (bytes): lines between '%' lines, joined by '\\n'; empty skipped."""
    for path in fortune_files(root):
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        entry = []
        for line in lines + [b"%"]:
            if line == b"%":
                if entry and b"\n".join(entry):
                    yield b"\n".join(entry)
                entry = []
            else:
                entry.append(line)


def special_id(tokenizer, names):
    for t in tokenizer.get("added_tokens", []):
        if t["content"] in names:
            return t["id"]
    raise SystemExit(f"the tokenizer has none of {names}: write it with lockstep (tokenize train "
                     "--add-special-tokens, or a training run's checkpoint directory)")


def vocab_size(tokenizer):
    ids = list(tokenizer["model"]["vocab"].values()) + [t["id"] for t in tokenizer.get("added_tokens", [])]
    return max(ids) + 1


def read_splits(a):
    """(training sequences, held-out sequences, pad id, vocabulary size): lockstep's split and ids."""
    with open(a.tokenizer) as f:
        tokenizer = json.load(f)
    eos = special_id(tokenizer, ("<|endoftext|>", "[SEP]"))
    pad = special_id(tokenizer, ("<pad>", "[PAD]"))
    with open(a.ids) as f:
        ids = f.read().split("\n")
    if ids and ids[-1] == "":
        ids.pop()
    train, test = [], []
    train_seen = test_seen = 0
    count = 0
    for i, entry in enumerate(fortune_entries(a.corpus)):
        count = i + 1
        held = i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        if entry.strip(b" \t\n\r"):
            if held:
                test_seen += 1
                test.append(i)
            else:
                train_seen += 1
                if not a.limit or len(train) < a.limit:
                    train.append(i)
        if a.limit and train_seen >= a.limit and test_seen > 0:
            break
    if count > len(ids):
        raise SystemExit(f"--ids '{a.ids}' has {len(ids)} lines but the corpus has at least {count} entries: "
                         "encode the same corpus (lockstep tokenize encode --corpus-format fortunes)")
    seq = lambda i: [eos] + [int(t) for t in ids[i].split()] + [eos]  # noqa: E731
    return [seq(i) for i in train], [seq(i) for i in test], pad, vocab_size(tokenizer)


class Sequences(torch.utils.data.Dataset):
    def __init__(self, seqs, max_length):
        self.seqs, self.max_length = seqs, max_length

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        s = self.seqs[i]
        n = min(len(s) - 1, self.max_length)
        return s[:n], s[1:n + 1]


def collate(pad):
    def pad_batch(samples):
        # input (B, T) padded with <pad>, target (B, T) with -100 at padding
        T = max(len(x) for x, _ in samples)
        x = torch.full((len(samples), T), pad, dtype=torch.long)
        y = torch.full((len(samples), T), IGNORE_INDEX, dtype=torch.long)
        for b, (xi, yi) in enumerate(samples):
            x[b, :len(xi)] = torch.tensor(xi)
            y[b, :len(yi)] = torch.tensor(yi)
        return x, y
    return pad_batch


def init_like_lockstep(model, layers):
    """GPT-2's initialisation as models::GptMini does it (LayerNorms keep ones and zeros)."""
    std = 0.02
    with torch.no_grad():
        model.wte.weight.normal_(0.0, std)
        model.wpe.weight.normal_(0.0, std)
        for block in model.h:
            for linear, s in ((block.attn.c_attn, std), (block.mlp.c_fc, std),
                              (block.attn.c_proj, std / math.sqrt(2.0 * layers)),
                              (block.mlp.c_proj, std / math.sqrt(2.0 * layers))):
                linear.weight.normal_(0.0, s)
                linear.bias.zero_()


def lm_loss(logits, y):
    # (B, T, V), (B, T) -> the mean over the real target tokens
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE_INDEX)


def held_out_loss(model, test, pad, max_length):
    """The mean next-token loss over every held-out target token (its exp is the perplexity)."""
    model.eval()
    total = tokens = 0.0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(Sequences(test, max_length), batch_size=EVAL_BATCH,
                                                collate_fn=collate(pad)):
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                     ignore_index=IGNORE_INDEX, reduction="sum").item()
            tokens += int((y != IGNORE_INDEX).sum())
    return total / tokens


def plan(a, train, world):
    """The batches' figures, as every rank of a `world`-rank run would cut them."""
    lengths = [min(len(s) - 1, a.max_length) for s in train]
    tokens = padded = steps = 0
    fractions = []
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(range(len(train)), world, rank, shuffle=True, seed=a.seed)
        for ep in range(a.epochs):
            sampler.set_epoch(ep)
            order = list(sampler)
            real = pad_total = 0
            for i in range(0, len(order), a.batch_size):
                batch = [lengths[j] for j in order[i:i + a.batch_size]]
                real += sum(batch)
                pad_total += max(batch) * len(batch)
                steps += rank == 0
            tokens += real
            padded += pad_total
            if ep == a.epochs - 1:
                fractions.append(1 - real / pad_total)
    return {"sequences": len(train), "world": world, "epochs": a.epochs, "batch_size": a.batch_size,
            "steps": steps, "target_tokens": tokens, "padded_tokens": padded,
            "padding_fraction": round(sum(fractions) / len(fractions), 4)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", default="/usr/share/games/fortunes")
    p.add_argument("--ids", required=True, help="lockstep tokenize encode's output for --corpus")
    p.add_argument("--tokenizer", required=True, help="the tokenizer.json that encoded --ids")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--init-weights", help="start from this state dict (torch.save of the model's)")
    p.add_argument("--plan", action="store_true", help="print the batches' figures; no training")
    p.add_argument("--plan-world", type=int, default=2, help="--plan: ranks to cut batches for")
    p.add_argument("--save-init", help="--plan: write initial weights here")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP module; its first step is not timed")
    p.add_argument("--eval-weights", help="no training: the held-out loss of this state dict (lockstep's --save-model)")
    a = p.parse_args()

    train, test, pad, vocab = read_splits(a)
    torch.manual_seed(a.seed)
    model = GptMini(vocab, a.max_length, a.n_embd, a.n_head, a.n_layer, pad_id=pad)
    init_like_lockstep(model, a.n_layer)
    if a.plan:
        if a.save_init:
            torch.save(model.state_dict(), a.save_init)
        figures = plan(a, train, a.plan_world)
        figures.update({"vocab_size": vocab, "parameters": sum(t.numel() for t in model.parameters())})
        print(json.dumps(figures))
        return
    if a.eval_weights:
        model.load_state_dict(torch.load(a.eval_weights), strict=True)
        loss = held_out_loss(model, test, pad, a.max_length)
        print(json.dumps({"test_loss": round(loss, 6), "perplexity": round(math.exp(loss), 3)}))
        return
    if a.init_weights:
        model.load_state_dict(torch.load(a.init_weights), strict=True)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    data = Sequences(train, a.max_length)
    sampler = torch.utils.data.DistributedSampler(data, world, rank, shuffle=True, seed=a.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch_size, sampler=sampler, num_workers=0,
                                         collate_fn=collate(pad))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr)
    if a.compile:
        net = torch.compile(net)

    tokens = samples = 0
    untimed_tokens = untimed_samples = 0
    compile_s = 0.0
    losses = []
    t0 = time.perf_counter()
    for ep in range(a.epochs):
        sampler.set_epoch(ep)
        net.train()
        for x, y in loader:
            if a.compile:  # one graph for every batch shape
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(x, 1)
            loss = lm_loss(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            tokens += int((y != IGNORE_INDEX).sum())
            samples += x.size(0)
            if len(losses) < FIRST_LOSSES:
                losses.append(loss.item())
            if a.compile and samples == x.size(0):  # the step that compiled: not timed
                compile_s = time.perf_counter() - t0
                untimed_tokens, untimed_samples = tokens, samples
    train_s = time.perf_counter() - t0 - compile_s

    test_loss = held_out_loss(model, test, pad, a.max_length)
    counts = torch.tensor([float(tokens), float(samples), float(untimed_tokens), float(untimed_samples)], dtype=torch.float64)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    rss_ranks = [rss.clone() for _ in range(world)]
    if world > 1:
        dist.all_reduce(counts)
        dist.all_gather(rss_ranks, rss)
    if rank == 0:
        print(json.dumps({"peer": "pytorch-python", "world": world, "threads": torch.get_num_threads(),
                          "tokens_per_s": round((counts[0].item() - counts[2].item()) / train_s, 1),
                          "compile": a.compile, "compile_s": round(compile_s, 2), "torch": torch.__version__,
                          "samples_per_s": round((counts[1].item() - counts[3].item()) / train_s, 2), "train_s": round(train_s, 3),
                          "target_tokens": int(counts[0].item()), "samples": int(counts[1].item()),
                          "first_losses": [round(v, 6) for v in losses],
                          "test_loss": round(test_loss, 6), "perplexity": round(math.exp(test_loss), 3),
                          "peak_rss_mib": round(rss_ranks[0].item(), 1),
                          "peak_rss_mib_ranks": [round(r.item(), 1) for r in rss_ranks]}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
