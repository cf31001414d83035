"""Learning-rate sequences from torch.optim.lr_scheduler, the reference for tests/train/lr_schedule_test.cpp.

usage: lr_schedules.py '<json list of cases>'
Each case has the fields of lockstep::train::LrScheduleOptions (kind, base_lr, total_steps, step_size,
gamma, milestones, eta_min, warmup_steps) and `steps`. Prints {"lrs": [[lr before optimizer step 0,
1, ..., steps - 1], ...]}, one list per case.

Warmup is SequentialLR([LinearLR(start_factor=1/warmup, total_iters=warmup), main],
milestones=[warmup]): the main schedule starts at step `warmup`, counting its own steps from 0 there.
"""
import json
import sys
import warnings

import torch
from torch.optim import lr_scheduler as sched


# SequentialLR calls step(0) at the milestone, which warns that the epoch argument is deprecated.
warnings.filterwarnings("ignore", category=UserWarning)


def main_scheduler(opt, c, warmup):
    kind = c["kind"]
    if kind == "constant":
        return sched.LambdaLR(opt, lambda _: 1.0)
    if kind == "step":
        return sched.StepLR(opt, step_size=c["step_size"], gamma=c["gamma"])
    if kind == "multistep":
        return sched.MultiStepLR(opt, milestones=c["milestones"], gamma=c["gamma"])
    if kind == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=c["total_steps"] - warmup, eta_min=c["eta_min"])
    raise ValueError(kind)


def lrs(c):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=c["base_lr"])
    warmup = c["warmup_steps"]
    s = main_scheduler(opt, c, warmup)
    if warmup > 0:
        linear = sched.LinearLR(opt, start_factor=1.0 / warmup, total_iters=warmup)
        s = sched.SequentialLR(opt, [linear, s], milestones=[warmup])
    out = []
    for _ in range(c["steps"]):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


print(json.dumps({"lrs": [lrs(c) for c in json.loads(sys.argv[1])]}))
