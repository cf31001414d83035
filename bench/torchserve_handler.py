"""TorchServe's default handler (ts.torch_handler.base_handler.BaseHandler: it loads the archive's
TorchScript file, runs inference under torch.inference_mode and answers each request with its row
of the output) with the one method it cannot do for a raw tensor: preprocess. BaseHandler's
torch.as_tensor(data) takes a list of request dicts, so every TorchServe user with tensor inputs
writes this: each request body is one sample of float32 bytes, (1,28,28) as the model takes it
(the same bytes as the binary tensor of the KServe v2 requests the other servers get), and the
requests TorchServe batched become one (B,1,28,28) tensor.

Packed by bench/serve_vs_servers.sh: torch-model-archiver --serialized-file model.pt --handler this."""
import os

import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler

SAMPLE = (1, 28, 28)


class RawTensorHandler(BaseHandler):
    def initialize(self, context):
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))  # as the other servers get
        super().initialize(context)

    def preprocess(self, data):
        rows = []
        for request in data:
            body = request.get("data") or request.get("body")
            if not isinstance(body, (bytes, bytearray)) or len(body) != 4 * int(np.prod(SAMPLE)):
                raise ValueError(f"a request body must be {4 * int(np.prod(SAMPLE))} bytes of float32 "
                                 f"(one {SAMPLE} sample), not {type(body).__name__} of {len(body or b'')}")
            rows.append(np.frombuffer(body, dtype=np.float32).reshape(SAMPLE))
        return torch.from_numpy(np.stack(rows))
