"""shared/peer/serve_peer.py with one addition for PyTorch 2.x, --compile: the model through
torch.compile (inductor, CPU), as a Python user chasing speed would serve it. It compiles for the
batch-1 input before the server says ready, so no request pays for the compile.

Peer baseline for serving: what a Python user writes today to serve the convnet over HTTP with the
KServe v2 (Triton) inference protocol: FastAPI + uvicorn + PyTorch, one request = one forward, no
dynamic batching. lockstep's server is measured against it on the same machine, in the same run.

Needs: torch, fastapi and uvicorn (the venv's: scripts/bootstrap --test; or Debian's python3-torch,
       python3-fastapi and python3-uvicorn, PyTorch 1.13, without --compile)
Run:   .venv/bin/python bench/serve_peer.py --weights convnet.pt --port 8011 [--threads 1] [--compile]
       (convnet.pt: `lockstep train --model convnet --save-model convnet.pt`)
Then:  POST /v2/models/convnet/infer with
       {"inputs":[{"name":"input","shape":[N,1,28,28],"datatype":"FP32","data":[...]}]}
       (the input exactly as the model takes it; no preprocessing in the server)."""
import argparse

import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from fmnist_ddp import ConvNet

app = FastAPI()
MODEL = {"net": None, "name": "convnet"}


@app.get("/v2/health/live")
def live():
    return Response(status_code=200)


@app.get("/v2/health/ready")
def ready():
    return Response(status_code=200 if MODEL["net"] is not None else 503)


@app.get("/v2/models/{name}")
def metadata(name: str):
    if name != MODEL["name"]:
        raise HTTPException(404, f"unknown model '{name}'")
    return {"name": name, "platform": "pytorch_torchscript", "versions": ["1"],
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request):
    if name != MODEL["name"]:
        return JSONResponse({"error": f"unknown model '{name}'"}, status_code=404)
    try:
        body = await request.json()
        inp = body["inputs"][0]
        x = torch.tensor(inp["data"], dtype=torch.float32).reshape(inp["shape"])
    except Exception as e:  # malformed request
        return JSONResponse({"error": f"bad request: {e}"}, status_code=400)
    with torch.inference_mode():
        y = MODEL["net"](x)
    return {"model_name": name, "id": body.get("id", ""),
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": list(y.shape),
                         "data": y.flatten().tolist()}]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--weights", required=True)
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="torch.compile the model, compiled before ready")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    net = ConvNet()
    net.load_state_dict(torch.load(a.weights))
    net = net.eval()
    if a.compile:
        net = torch.compile(net)
        with torch.inference_mode():
            net(torch.zeros(1, 1, 28, 28))  # compiles for the benchmark's batch-1 requests
    MODEL["net"] = net
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
