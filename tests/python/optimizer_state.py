"""Checks lockstep's optimizer state dicts against Python's torch.optim SGD, Adam and AdamW.

The model is nn.Sequential(Linear(4, 8), Tanh(), Linear(8, 3)) with an MSE loss; step i trains on
the batch x[i], y[i]. IN is a dict written by lockstep (lockstep::torch_save) holding "kind" (sgd,
adam or adamw), "model" (a state dict), "x" (steps, batch, 4) and "y" (steps, batch, 3). KWARGS is
the JSON of the keyword arguments that build the Python optimizer lockstep's options describe.

  optimizer_state.py continue IN KWARGS FIRST STEPS OUT
      IN also holds "optimizer" (lockstep's state dict). Loads it into a Python optimizer built
      with lr=0.5 (so the saved hyperparameters must replace it), trains steps FIRST..FIRST+STEPS-1
      and saves {"model": state_dict} to OUT. Prints, as the last line, JSON comparing lockstep's
      layout with the state_dict() of a Python optimizer built from KWARGS after one step.
  optimizer_state.py train IN KWARGS K M SAVED FINAL
      Trains K steps from IN's model, saves {"model": model.state_dict(), "optimizer":
      opt.state_dict()} to SAVED with torch.save, trains M more and saves {"model": ...} to FINAL.
"""
import copy
import json
import sys

import torch
from torch import nn
from torch.nn import functional as F

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def make_model(state):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    model.load_state_dict(state)
    return model


def make_optimizer(kind, params, kwargs):
    kwargs = dict(kwargs)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    return OPTIMIZERS[kind](params, **kwargs)


def train(model, opt, x, y, first, steps):
    for i in range(first, first + steps):
        opt.zero_grad()
        F.mse_loss(model(x[i]), y[i]).backward()
        opt.step()


def jsonable(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def layout_report(ours, kind, kwargs, model, x, y):
    """How lockstep's state dict `ours` differs from Python's own for the same optimizer."""
    reference_model = copy.deepcopy(model)
    reference = make_optimizer(kind, reference_model.parameters(), kwargs)
    train(reference_model, reference, x, y, 0, 1)
    theirs = reference.state_dict()
    our_group, their_group = ours["param_groups"][0], theirs["param_groups"][0]
    differing = {k: [jsonable(our_group[k]), jsonable(their_group[k])]
                 for k in our_group if k in their_group and k != "params"
                 and jsonable(our_group[k]) != jsonable(their_group[k])}
    report = {
        "group_keys": {"ours": list(our_group), "python": list(their_group)},
        "group_values_differing": differing,
        "state_keys": {"ours": list(ours["state"][0]) if 0 in ours["state"] else None,
                       "python": list(theirs["state"][0])},
        "state_types": {"ours": {k: str(type(v).__name__) for k, v in ours["state"].get(0, {}).items()},
                        "python": {k: str(type(v).__name__) for k, v in theirs["state"][0].items()}},
    }
    for name, state in (("ours", ours), ("python", theirs)):
        step = state["state"].get(0, {}).get("step")
        if step is not None:
            report.setdefault("step", {})[name] = [str(step.dtype), list(step.shape), step.item()]
    return report


def continue_training(path, kwargs, first, steps, out):
    saved = torch.load(path)
    kind = saved["kind"]
    model = make_model(saved["model"])
    report = layout_report(saved["optimizer"], kind, kwargs, model, saved["x"], saved["y"])
    opt = make_optimizer(kind, model.parameters(), {"lr": 0.5})
    opt.load_state_dict(saved["optimizer"])
    report["loaded_lr"] = opt.param_groups[0]["lr"]
    train(model, opt, saved["x"], saved["y"], first, steps)
    torch.save({"model": model.state_dict()}, out)
    print(json.dumps(report))


def train_and_save(path, kwargs, k, m, saved_path, final_path):
    saved = torch.load(path)
    model = make_model(saved["model"])
    opt = make_optimizer(saved["kind"], model.parameters(), kwargs)
    train(model, opt, saved["x"], saved["y"], 0, k)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved_path)
    train(model, opt, saved["x"], saved["y"], k, m)
    torch.save({"model": model.state_dict()}, final_path)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "continue":
        continue_training(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif mode == "train":
        train_and_save(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
                       sys.argv[6], sys.argv[7])
    else:
        sys.exit(f"unknown mode {mode!r}: expected continue or train")
