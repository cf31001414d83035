"""Triton's own HTTP client (tritonclient.http, PyPI) against lockstep serve, for the serve tests.

Usage: python triton_client.py SERVER_URL MODEL INPUT_FILE json|binary
  SERVER_URL: http://HOST:PORT; INPUT_FILE: {"shape": [n, ...], "data": [flat fp32 values]}
  json sends and asks for JSON tensors; binary uses the binary tensor data extension both ways.
Prints one JSON line: {"status", "id", "shape", "data", "binary_data_size"} (the logits), or
{"status", "error"} when the server refuses the request.
"""
import json
import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def main():
    if len(sys.argv) != 5 or sys.argv[4] not in ("json", "binary"):
        sys.exit("usage: python triton_client.py SERVER_URL MODEL INPUT_FILE json|binary")
    url, model, input_file, mode = sys.argv[1:]
    with open(input_file, encoding="utf-8") as f:
        given = json.load(f)
    values = np.asarray(given["data"], dtype=np.float32).reshape(given["shape"])
    binary = mode == "binary"
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"), network_timeout=30)
    tensor = httpclient.InferInput("input", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=binary)
    wanted = httpclient.InferRequestedOutput("logits", binary_data=binary)
    try:
        result = client.infer(model, [tensor], outputs=[wanted], request_id="triton-" + mode)
    except InferenceServerException as e:
        print(json.dumps({"status": e.status(), "error": e.message()}))
        return
    output = result.get_output("logits")
    logits = result.as_numpy("logits")
    print(json.dumps({"status": 200, "id": result.get_response()["id"], "shape": list(logits.shape),
                      "data": logits.flatten().tolist(),
                      "binary_data_size": output.get("parameters", {}).get("binary_data_size", 0)}))


if __name__ == "__main__":
    main()
