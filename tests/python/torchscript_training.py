#!/usr/bin/env python3
"""Python's side of training a TorchScript model with lockstep (tests/train/torchscript_train_test.cpp).

The model is torchscript_models.py's ImageMlp, as Python code (not the script); the data DATA is a
file lockstep wrote with lockstep::torch_save: {"x": (N, 1, 28, 28) float, "y": (N) int64}. An epoch
visits DATA in torch.utils.data.DistributedSampler's order for one replica (seed SEED, set_epoch),
in batches of BATCH, with the mean cross-entropy and SGD(lr=LR, momentum=0.9), as lockstep's
Trainer does.

  torchscript_training.py train INITIAL DATA EPOCH BATCH SEED LR OUT
      Starts from INITIAL's weights (a TorchScript file), trains epoch EPOCH, and saves
      {"model": model.state_dict(), "optimizer": opt.state_dict()} to OUT with torch.save.
  torchscript_training.py continue CHECKPOINT DATA EPOCH BATCH SEED LR OUT
      Loads CHECKPOINT's "model" into the model and its "optimizer" into the optimizer (lockstep's
      checkpoint, or the file `train` wrote), trains epoch EPOCH and saves as `train` does.
  torchscript_training.py logits MODEL STATE_DICT SCRIPT INPUT OUT
      Python's class MODEL (a file name in torchscript_models.MODELS) with STATE_DICT loaded
      (load_state_dict(torch.load(STATE_DICT))), and torch.jit.load(SCRIPT), both in eval mode, run
      INPUT (a tensor lockstep pickled); writes {"class": logits, "script": logits} as JSON to OUT.
"""
import json
import os
import sys

import torch
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchscript_models import MODELS, ImageMlp  # noqa: E402


def epoch(model, opt, data, number, batch, seed):
    sampler = torch.utils.data.DistributedSampler(range(len(data["y"])), num_replicas=1, rank=0, shuffle=True,
                                                  seed=seed)
    sampler.set_epoch(number)
    order = list(sampler)
    model.train()
    for first in range(0, len(order), batch):
        rows = torch.tensor(order[first:first + batch])
        opt.zero_grad()
        F.cross_entropy(model(data["x"][rows]), data["y"][rows]).backward()
        opt.step()


def train(start_model, start_optimizer, data_file, number, batch, seed, lr, out):
    torch.set_num_threads(1)
    model = ImageMlp()
    model.load_state_dict(start_model)
    opt = torch.optim.SGD(model.parameters(), lr=float(lr), momentum=0.9)
    if start_optimizer is not None:
        opt.load_state_dict(start_optimizer)
    epoch(model, opt, torch.load(data_file), int(number), int(batch), int(seed))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, out)


def logits(model_name, state_dict, script, input_file, out):
    model = MODELS[model_name]()
    model.load_state_dict(torch.load(state_dict))
    model.eval()
    loaded = torch.jit.load(script).eval()
    x = torch.load(input_file)
    with torch.no_grad():
        result = {"class": model(x).tolist(), "script": loaded(x).tolist()}
    with open(out, "w") as f:
        json.dump(result, f)


def main(argv):
    if argv[0] == "train":
        train(torch.jit.load(argv[1]).state_dict(), None, *argv[2:])
    elif argv[0] == "continue":
        checkpoint = torch.load(argv[1])
        train(checkpoint["model"], checkpoint["optimizer"], *argv[2:])
    elif argv[0] == "logits":
        logits(*argv[1:])
    else:
        sys.exit(f"unknown command {argv[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
