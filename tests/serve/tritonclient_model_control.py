"""Triton's model repository extension through tritonclient (HTTP and gRPC) against a server in
explicit model control mode.

Usage: python tritonclient_model_control.py HTTP_HOST:PORT GRPC_HOST:PORT
  The server's repository holds convnet models 'a' and 'b' (input "input" (B,1,28,28) FP32, output
  "logits"), started with --model-control-mode explicit --load-model a, and a directory 'broken'
  whose config.pbtxt does not parse.
Prints one JSON line: {"checks": {NAME: "ok" or what went wrong}, "unload_under_load": {...}}.
"""
import json
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client_checks import run_check

TIMEOUT_S = 30


def main():
    http_url, grpc_url = sys.argv[1:3]
    http = httpclient.InferenceServerClient(url=http_url, network_timeout=TIMEOUT_S, concurrency=16)
    grpc = grpcclient.InferenceServerClient(url=grpc_url)
    image = np.random.default_rng(2).standard_normal((1, 1, 28, 28), dtype=np.float32)
    checks, figures = {}, {}

    def inputs(module):
        x = module.InferInput("input", [1, 1, 28, 28], "FP32")
        x.set_data_from_numpy(image)
        return [x]

    def check(name, body):
        run_check(checks, name, body)

    def index(client):
        models = client.get_model_repository_index()
        rows = models if isinstance(models, list) else [
            {"name": m.name, "state": m.state, "reason": m.reason} for m in models.models]
        return {(r["name"], r.get("state", ""), r.get("reason", "")) for r in rows}

    def refused(call, words):
        try:
            call()
        except InferenceServerException as e:
            assert words in e.message(), e.message()
            return str(e.status())
        raise AssertionError(f"accepted: expected a refusal naming {words!r}")

    def startup():
        assert http.is_model_ready("a") and not http.is_model_ready("b")
        assert http.is_server_ready()  # models not loaded on purpose do not count against readiness
        rows = index(http)
        assert ("a", "READY", "") in rows and ("b", "UNAVAILABLE", "unloaded") in rows, rows
        assert any(name == "broken" and reason == "unloaded" for name, _, reason in rows), rows
        assert index(grpc) == rows, (index(grpc), rows)

    def load_and_unload(client, module):
        def run():
            client.load_model("b")
            assert client.is_model_ready("b")
            logits = client.infer("b", inputs(module)).as_numpy("logits")
            assert logits.shape == (1, 10), logits.shape
            client.unload_model("b")
            assert not client.is_model_ready("b")
            assert ("b", "UNAVAILABLE", "unloaded") in index(client)
            refused(lambda: client.infer("b", inputs(module)), "unloaded")
            refused(lambda: client.unload_model("b"), "is not loaded")
        return run

    def config_override(client, module):
        def run():  # a's configuration as the server reports it, for model b with a smaller batch
            override = dict(http.get_model_config("a"), name="b", max_batch_size=2)
            client.load_model("b", config=json.dumps(override))
            assert http.get_model_config("b")["max_batch_size"] == 2
            three = module.InferInput("input", [3, 1, 28, 28], "FP32")
            three.set_data_from_numpy(np.zeros((3, 1, 28, 28), dtype=np.float32))
            refused(lambda: client.infer("b", [three]), "at most 2 samples")
            assert client.infer("b", inputs(module)).as_numpy("logits").shape == (1, 10)
            client.load_model("b")  # without an override: config.pbtxt's again
            assert http.get_model_config("b")["max_batch_size"] == 64
            client.unload_model("b")
        return run

    def failures():
        for client in (http, grpc):
            refused(lambda: client.load_model("no_such_model"), "no model directory 'no_such_model'")
            refused(lambda: client.load_model("broken"), "failed to load")
            refused(lambda: client.load_model("a", config='{"max_batch_size": "two"}'), "config override")
            refused(lambda: client.load_model("a", config='{"max_batch_size": 2}', files={"file:1/model.pt": b"x"}),
                    "a load reads the model's files from the repository")
            assert client.is_model_ready("a")  # the others keep serving
            client.infer("a", inputs(httpclient if client is http else grpcclient))

    def unload_under_load():
        grpc.load_model("b")
        done = queue.Queue()
        n = 200
        for i in range(n):
            grpc.async_infer("b", inputs(grpcclient), lambda result, error: done.put(error), client_timeout=TIMEOUT_S)
            if i == n // 2:
                http.unload_model("b")  # while half the calls are sent, many of them queued
        outcomes = {}
        for _ in range(n):
            error = done.get(timeout=TIMEOUT_S)  # every call answered: none dropped, none hangs
            key = "OK" if error is None else error.status() + ": " + error.message().split(":")[0]
            outcomes[key] = outcomes.get(key, 0) + 1
        figures["unload_under_load"] = outcomes
        assert sum(outcomes.values()) == n and outcomes.get("OK", 0) > 0, outcomes
        for key in outcomes:
            assert key == "OK" or "UNAVAILABLE" in key, outcomes  # refused as not ready / shutting down
        assert not grpc.is_model_ready("b")

    check("startup", startup)
    check("load_and_unload_http", load_and_unload(http, httpclient))
    check("load_and_unload_grpc", load_and_unload(grpc, grpcclient))
    check("config_override_http", config_override(http, httpclient))
    check("config_override_grpc", config_override(grpc, grpcclient))
    check("failures", failures)
    check("unload_under_load", unload_under_load)
    http.close()
    grpc.close()
    print(json.dumps({"checks": checks, **figures}))


if __name__ == "__main__":
    main()
