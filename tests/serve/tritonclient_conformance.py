"""Triton's own HTTP client (tritonclient.http) through its whole API against lockstep serve.

Usage: python tritonclient_conformance.py SERVER_URL MODEL_FILE TOKEN
  SERVER_URL: http://HOST:PORT of a server whose repository holds MODEL_FILE as model 'two_input'
  (tests/python/torchscript_serving_models.py's two_input.pt: INPUT__0 (B,1,28,28) FP32 and
  INPUT__1 (B,8) FP32 -> OUTPUT__0 logits (B,10) FP32, OUTPUT__1 class (B,1) INT64), guarded by
  the bearer TOKEN. The expected outputs are the module's own, run here by torch.
Prints one JSON line: {"tritonclient": VERSION, "checks": {NAME: "ok" or what went wrong}}.
"""
import json
import sys
from importlib import metadata

import numpy as np
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client_checks import run_check

MODEL = "two_input"
# The server runs the same TorchScript module on the same kernels; batching with other requests
# changes the rows a kernel sees, so float32 rounding only.
TOLERANCE = 1e-5


def inputs_of(image, features, binary):
    a = httpclient.InferInput("INPUT__0", list(image.shape), "FP32")
    a.set_data_from_numpy(image, binary_data=binary)
    b = httpclient.InferInput("INPUT__1", list(features.shape), "FP32")
    b.set_data_from_numpy(features, binary_data=binary)
    return [a, b]


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: python tritonclient_conformance.py SERVER_URL MODEL_FILE TOKEN")
    url, model_file, token = sys.argv[1:]
    module = torch.jit.load(model_file).eval()
    # A fresh dict each call: tritonclient writes Inference-Header-Content-Length into the headers it
    # is given, and a dict kept across calls sends a binary request's JSON length with the next one.
    auth = {"Authorization": "Bearer " + token}
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"), network_timeout=30, concurrency=8)
    rng = np.random.default_rng(3)
    checks = {}
    samples = 0  # inferred so far, for the statistics
    requests = 0

    def expected(image, features):
        with torch.no_grad():
            logits, cls = module(torch.from_numpy(image), torch.from_numpy(features))
        return logits.numpy(), cls.numpy()

    def batch(n):
        return (rng.standard_normal((n, 1, 28, 28), dtype=np.float32), rng.standard_normal((n, 8), dtype=np.float32))

    def check(name, body):
        run_check(checks, name, body)

    def health():
        assert client.is_server_live(headers=dict(auth))
        assert client.is_server_ready(headers=dict(auth))
        assert client.is_model_ready(MODEL, headers=dict(auth))
        assert not client.is_model_ready("no_such_model", headers=dict(auth))

    def server_metadata():
        m = client.get_server_metadata(headers=dict(auth))
        assert m["name"] and m["version"] and "model_configuration" in m["extensions"], m

    def model_metadata():
        m = client.get_model_metadata(MODEL, headers=dict(auth))
        assert m["name"] == MODEL, m
        assert [(t["name"], t["datatype"], t["shape"]) for t in m["inputs"]] == [
            ("INPUT__0", "FP32", [-1, 1, 28, 28]), ("INPUT__1", "FP32", [-1, 8])], m
        assert [(t["name"], t["datatype"], t["shape"]) for t in m["outputs"]] == [
            ("OUTPUT__0", "FP32", [-1, 10]), ("OUTPUT__1", "INT64", [-1, 1])], m

    def model_config():
        c = client.get_model_config(MODEL, headers=dict(auth))
        assert c["name"] == MODEL and c["max_batch_size"] == 8, c
        assert [(t["name"], t["data_type"], t["dims"]) for t in c["input"]] == [
            ("INPUT__0", "TYPE_FP32", [1, 28, 28]), ("INPUT__1", "TYPE_FP32", [8])], c
        assert [(t["name"], t["data_type"], t["dims"]) for t in c["output"]] == [
            ("OUTPUT__0", "TYPE_FP32", [10]), ("OUTPUT__1", "TYPE_INT64", [1])], c
        assert c["instance_group"][0]["count"] == 2 and c["instance_group"][0]["kind"] == "KIND_CPU", c

    def infer(binary):
        def run():
            nonlocal samples, requests
            image, features = batch(3)
            want_logits, want_class = expected(image, features)
            outputs = [httpclient.InferRequestedOutput("OUTPUT__0", binary_data=binary),
                       httpclient.InferRequestedOutput("OUTPUT__1", binary_data=binary)]
            r = client.infer(MODEL, inputs_of(image, features, binary), outputs=outputs, request_id="r-" + str(binary),
                             headers=dict(auth))
            samples, requests = samples + 3, requests + 1
            assert r.get_response()["id"] == "r-" + str(binary), r.get_response()
            np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), want_logits, rtol=0, atol=TOLERANCE)
            assert r.as_numpy("OUTPUT__1").dtype == np.int64
            np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), want_class)
            for o in r.get_response()["outputs"]:
                assert ("binary_data_size" in o.get("parameters", {})) == binary, o
        return run

    def requested_output_subset():
        nonlocal samples, requests
        image, features = batch(2)
        _, want_class = expected(image, features)
        r = client.infer(MODEL, inputs_of(image, features, True),
                         outputs=[httpclient.InferRequestedOutput("OUTPUT__1", binary_data=True)], headers=dict(auth))
        samples, requests = samples + 2, requests + 1
        assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT__1"], r.get_response()
        assert r.as_numpy("OUTPUT__0") is None
        np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), want_class)

    def default_outputs():
        nonlocal samples, requests
        image, features = batch(1)
        want_logits, _ = expected(image, features)
        r = client.infer(MODEL, inputs_of(image, features, False), headers=dict(auth))  # no outputs named: all, JSON
        samples, requests = samples + 1, requests + 1
        assert sorted(o["name"] for o in r.get_response()["outputs"]) == ["OUTPUT__0", "OUTPUT__1"], r.get_response()
        np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), want_logits, rtol=0, atol=TOLERANCE)

    def async_infer():
        nonlocal samples, requests
        sent = []
        for i in range(16):
            image, features = batch(1 + i % 4)
            sent.append((image, features, client.async_infer(MODEL, inputs_of(image, features, i % 2 == 0),
                                                             request_id=str(i), headers=dict(auth))))
        for i, (image, features, pending) in enumerate(sent):
            r = pending.get_result(timeout=30)
            want_logits, want_class = expected(image, features)
            assert r.get_response()["id"] == str(i)
            np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), want_logits, rtol=0, atol=TOLERANCE)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), want_class)
            samples, requests = samples + image.shape[0], requests + 1

    def statistics():
        s = client.get_inference_statistics(MODEL, headers=dict(auth))["model_stats"]
        assert len(s) == 1 and s[0]["name"] == MODEL, s
        assert s[0]["inference_count"] == samples, (s[0]["inference_count"], samples)
        assert s[0]["inference_stats"]["success"]["count"] == requests, (s[0]["inference_stats"], requests)
        assert 1 <= s[0]["execution_count"] <= requests, s[0]
        everything = client.get_inference_statistics(headers=dict(auth))["model_stats"]
        assert [m["name"] for m in everything] == [MODEL], everything

    def repository_index():
        index = client.get_model_repository_index(headers=dict(auth))
        assert {(m["name"], m.get("state")) for m in index} == {(MODEL, "READY")}, index

    def refusals():
        image, features = batch(1)
        cases = [
            (lambda: client.infer("no_such_model", inputs_of(image, features, True), headers=dict(auth)), "404",
             "unknown model 'no_such_model'"),
            (lambda: client.infer(MODEL, inputs_of(image, features, True)[:1], headers=dict(auth)), "400", "INPUT__1"),
            (lambda: client.get_model_metadata(MODEL, headers={"Authorization": "Bearer wrong"}), "401", "token"),
        ]
        for call, status, words in cases:
            try:
                call()
            except InferenceServerException as e:
                assert str(e.status()) == status and words in e.message(), (e.status(), e.message())
            else:
                raise AssertionError(f"accepted: expected {status} naming {words!r}")

    check("health", health)
    check("server_metadata", server_metadata)
    check("model_metadata", model_metadata)
    check("model_config", model_config)
    check("infer_json", infer(False))
    check("infer_binary", infer(True))
    check("requested_output_subset", requested_output_subset)
    check("default_outputs", default_outputs)
    check("async_infer", async_infer)
    check("statistics", statistics)
    check("repository_index", repository_index)
    check("refusals", refusals)
    client.close()
    print(json.dumps({"tritonclient": metadata.version("tritonclient"), "checks": checks}))


if __name__ == "__main__":
    main()
