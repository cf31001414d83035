#!/usr/bin/env python3
"""The Python peer (../shared/peer/fmnist_ddp.py, unchanged: its data, loop, DDP and timing) with one
more model: the residual MLP of tests/python/torchscript_models.py (ImageMlp), as eager Python code.
bench/torchscript_vs_peer.sh gives lockstep the same model as TorchScript (`write` below).

  torchscript_peer.py write WIDTH OUT.pt      torch.jit.script(ImageMlp(WIDTH)) saved for lockstep
  torchscript_peer.py WIDTH [fmnist_ddp.py flags]   the peer training ImageMlp(WIDTH) (RANK, WORLD_SIZE,
                                                  MASTER_ADDR and MASTER_PORT as run_ddp.sh sets them)
"""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "python"))
sys.path.insert(0, os.environ.get("PEER_DIR", os.path.join(here, "..", "..", "shared", "peer")))
import fmnist_ddp  # noqa: E402
from torchscript_models import ImageMlp  # noqa: E402

if sys.argv[1] == "write":
    torch.manual_seed(0)
    torch.jit.script(ImageMlp(int(sys.argv[2]))).save(sys.argv[3])
else:
    width = int(sys.argv[1])
    fmnist_ddp.MODELS["residual-mlp"] = lambda num_classes=10: ImageMlp(width, num_classes)
    sys.argv = [sys.argv[0], "--model", "residual-mlp"] + sys.argv[2:]
    fmnist_ddp.main()
