"""Checks lockstep's GradScaler state_dict against Python's torch.cuda.amp.GradScaler.

`python3 amp_grad_scaler.py OURS THEIRS` loads OURS (written by lockstep::torch_save)
with torch.load into a GradScaler, prints what it then reports, and writes THEIRS: the state_dict
of a GradScaler(init_scale=128, growth_interval=100) whose growth tracker is at 5.

Without CUDA, GradScaler disables itself (and its state_dict is empty); making it believe CUDA is
there while it is constructed is enough here, since state_dict and load_state_dict are plain Python
until the first scale().
"""
import sys

import torch
from torch.cuda.amp import GradScaler


def enabled_scaler(**kwargs):
    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        return GradScaler(**kwargs)
    finally:
        torch.cuda.is_available = available


def main(ours, theirs):
    state = torch.load(ours)
    expected = ["scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"]
    if sorted(state) != sorted(expected):
        sys.exit(f"keys {sorted(state)} != {sorted(expected)}")
    if not isinstance(state["growth_interval"], int) or not isinstance(state["scale"], float):
        sys.exit(f"value types differ from Python's: {state}")
    scaler = enabled_scaler()
    scaler.load_state_dict(state)
    print(f"loaded scale={scaler.get_scale()} growth_tracker={scaler._get_growth_tracker()} "
          f"growth_factor={scaler.get_growth_factor()} backoff_factor={scaler.get_backoff_factor()} "
          f"growth_interval={scaler.get_growth_interval()}")

    source = enabled_scaler(init_scale=128.0, growth_interval=100)
    source._init_growth_tracker = 5
    torch.save(source.state_dict(), theirs)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
