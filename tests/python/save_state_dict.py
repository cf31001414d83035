"""Writes a real Python state dict for lockstep to load: `python3 save_state_dict.py MODEL PATH`.

The file is exactly what a Python user's `torch.save(model.state_dict(), PATH)` writes: an
OrderedDict with a `_metadata` attribute. The model (from reference_models.py) gets non-trivial
weights and batch-norm running statistics first. Prints one JSON line: every entry's values,
flattened, and the eval-mode logits for the fixed input reference_models.py uses.
"""
import collections
import json
import sys

import torch

from reference_models import MODELS


def main():
    name, path = sys.argv[1], sys.argv[2]
    cls, shape = MODELS[name]
    torch.manual_seed(7)
    model = cls()
    with torch.no_grad():
        model(torch.randn(8, *shape) * 2 + 0.5)  # train mode: moves the running statistics
    model.eval()
    state = model.state_dict()
    assert isinstance(state, collections.OrderedDict) and hasattr(state, "_metadata")
    torch.save(state, path)
    x = torch.linspace(-1, 1, 2 * shape[0] * shape[1] * shape[2]).reshape(2, *shape)
    with torch.no_grad():
        logits = model(x)
    print(json.dumps({"values": {k: v.double().flatten().tolist() for k, v in state.items()},
                      "logits": logits.flatten().tolist()}))


if __name__ == "__main__":
    main()
