"""Triton's own gRPC client (tritonclient.grpc, sync, callback-async and asyncio) against lockstep serve.

Usage: python tritonclient_grpc_conformance.py HOST:PORT MODEL_FILE TOKEN
  HOST:PORT: the gRPC port of a server whose repository holds MODEL_FILE as model 'two_input'
  (tests/python/torchscript_serving_models.py's two_input.pt: INPUT__0 (B,1,28,28) FP32 and
  INPUT__1 (B,8) FP32 -> OUTPUT__0 logits (B,10) FP32, OUTPUT__1 class (B,1) INT64; max_batch_size
  8, two instances), guarded by the bearer TOKEN. The expected outputs are the module's own, run
  here by torch.
Prints one JSON line: {"tritonclient": VERSION, "grpcio": VERSION, "checks": {NAME: "ok" or what
went wrong}}.
"""
import asyncio
import json
import queue
import sys
from importlib import metadata

import grpc
import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client_checks import run_check

MODEL = "two_input"
TOLERANCE = 1e-5  # the same module on the same kernels; batching changes only float32 rounding
TIMEOUT_S = 30


def inputs_of(image, features, module=grpcclient):
    a = module.InferInput("INPUT__0", list(image.shape), "FP32")
    a.set_data_from_numpy(image)
    b = module.InferInput("INPUT__1", list(features.shape), "FP32")
    b.set_data_from_numpy(features)
    return [a, b]


def refused(call, code, words):
    """`call` fails with gRPC status `code` and a message holding `words`."""
    try:
        call()
    except InferenceServerException as e:
        assert e.status() == "StatusCode." + code and words in e.message(), (e.status(), e.message())
    else:
        raise AssertionError(f"accepted: expected {code} naming {words!r}")


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: python tritonclient_grpc_conformance.py HOST:PORT MODEL_FILE TOKEN")
    url, model_file, token = sys.argv[1:]
    module = torch.jit.load(model_file).eval()
    auth = {"authorization": "Bearer " + token}
    client = grpcclient.InferenceServerClient(url=url)
    rng = np.random.default_rng(5)
    checks = {}
    counted = {"samples": 0, "requests": 0}  # inferred so far, for the statistics

    def expected(image, features):
        with torch.no_grad():
            logits, cls = module(torch.from_numpy(image), torch.from_numpy(features))
        return logits.numpy(), cls.numpy()

    def batch(n):
        return (rng.standard_normal((n, 1, 28, 28), dtype=np.float32), rng.standard_normal((n, 8), dtype=np.float32))

    def check_result(r, image, features, names=("OUTPUT__0", "OUTPUT__1")):
        want_logits, want_class = expected(image, features)
        got = [o.name for o in r.get_response().outputs]
        assert got == list(names), got
        if "OUTPUT__0" in names:
            np.testing.assert_allclose(r.as_numpy("OUTPUT__0"), want_logits, rtol=0, atol=TOLERANCE)
        if "OUTPUT__1" in names:
            assert r.as_numpy("OUTPUT__1").dtype == np.int64
            np.testing.assert_array_equal(r.as_numpy("OUTPUT__1"), want_class)
        counted["samples"] += image.shape[0]
        counted["requests"] += 1

    def check(name, body):
        run_check(checks, name, body)

    def health():
        assert client.is_server_live()  # the probes need no token, as HTTP's
        assert client.is_server_ready()
        assert client.is_model_ready(MODEL, headers=auth)
        assert client.is_model_ready(MODEL, "1", headers=auth)
        assert not client.is_model_ready("no_such_model", headers=auth)

    def server_metadata():
        m = client.get_server_metadata(headers=auth)
        assert m.name == "lockstep" and m.version, m
        assert {"model_configuration", "model_repository"} <= set(m.extensions), m

    def model_metadata():
        m = client.get_model_metadata(MODEL, headers=auth)
        assert m.name == MODEL and list(m.versions) == ["1"] and m.platform == "pytorch_libtorch", m
        assert [(t.name, t.datatype, list(t.shape)) for t in m.inputs] == [
            ("INPUT__0", "FP32", [-1, 1, 28, 28]), ("INPUT__1", "FP32", [-1, 8])], m
        assert [(t.name, t.datatype, list(t.shape)) for t in m.outputs] == [
            ("OUTPUT__0", "FP32", [-1, 10]), ("OUTPUT__1", "INT64", [-1, 1])], m
        j = client.get_model_metadata(MODEL, headers=auth, as_json=True)
        # proto3's JSON writes int64 as text
        assert j["name"] == MODEL and j["inputs"][0]["shape"] == ["-1", "1", "28", "28"], j

    def model_config():
        c = client.get_model_config(MODEL, headers=auth).config
        assert c.name == MODEL and c.max_batch_size == 8 and c.platform == "pytorch_libtorch", c
        fp32, int64 = 11, 9  # model_config.proto's TYPE_FP32 and TYPE_INT64
        assert [(t.name, t.data_type, list(t.dims)) for t in c.input] == [
            ("INPUT__0", fp32, [1, 28, 28]), ("INPUT__1", fp32, [8])], c
        assert [(t.name, t.data_type, list(t.dims)) for t in c.output] == [
            ("OUTPUT__0", fp32, [10]), ("OUTPUT__1", int64, [1])], c
        assert c.instance_group[0].count == 2 and c.instance_group[0].kind == 2, c  # KIND_CPU
        assert c.HasField("dynamic_batching"), c
        j = client.get_model_config(MODEL, headers=auth, as_json=True)["config"]
        assert j["input"][0]["data_type"] == "TYPE_FP32" and j["instance_group"][0]["kind"] == "KIND_CPU", j

    def infer():
        image, features = batch(3)
        r = client.infer(MODEL, inputs_of(image, features), request_id="g-1", headers=auth, client_timeout=TIMEOUT_S)
        assert r.get_response().id == "g-1" and r.get_response().model_version == "1", r.get_response()
        check_result(r, image, features)

    def requested_output_subset():
        image, features = batch(2)
        r = client.infer(MODEL, inputs_of(image, features), outputs=[grpcclient.InferRequestedOutput("OUTPUT__1")],
                         headers=auth, client_timeout=TIMEOUT_S)
        assert r.as_numpy("OUTPUT__0") is None
        check_result(r, image, features, names=("OUTPUT__1",))

    def typed_contents():
        # Values in the request's contents fields instead of raw_input_contents, as other clients send.
        image, features = batch(2)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        for name, array in (("INPUT__0", image), ("INPUT__1", features)):
            t = request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
            t.contents.fp32_contents.extend(array.flatten().tolist())
        with grpc.insecure_channel(url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            response = stub.ModelInfer(request, metadata=list(auth.items()), timeout=TIMEOUT_S)
        logits = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(2, 10)
        np.testing.assert_allclose(logits, expected(image, features)[0], rtol=0, atol=TOLERANCE)
        counted["samples"] += 2
        counted["requests"] += 1

    def async_infer():
        done = queue.Queue()
        sent = []
        for i in range(16):
            image, features = batch(1 + i % 4)
            sent.append((image, features))
            client.async_infer(MODEL, inputs_of(image, features), partial_callback(done, i), request_id=str(i),
                               headers=auth, client_timeout=TIMEOUT_S)
        results = {}
        for _ in sent:
            i, result, error = done.get(timeout=TIMEOUT_S)
            assert error is None, error
            results[i] = result
        for i, (image, features) in enumerate(sent):
            assert results[i].get_response().id == str(i)
            check_result(results[i], image, features)

    def asyncio_infer():
        async def run():
            async with aioclient.InferenceServerClient(url=url) as c:
                assert await c.is_model_ready(MODEL, headers=auth)
                pairs = [batch(1 + i % 3) for i in range(8)]
                results = await asyncio.gather(*[
                    c.infer(MODEL, inputs_of(image, features, aioclient), headers=auth, client_timeout=TIMEOUT_S)
                    for image, features in pairs])
                for r, (image, features) in zip(results, pairs):
                    check_result(r, image, features)
        asyncio.run(run())

    def statistics():
        s = client.get_inference_statistics(MODEL, headers=auth).model_stats
        assert len(s) == 1 and s[0].name == MODEL and s[0].version == "1", s
        assert s[0].inference_count == counted["samples"], (s[0].inference_count, counted)
        assert s[0].inference_stats.success.count == counted["requests"], (s[0].inference_stats, counted)
        assert 1 <= s[0].execution_count <= counted["requests"], s[0]
        assert s[0].inference_stats.compute_infer.ns > 0, s[0]
        assert sum(b.compute_infer.count for b in s[0].batch_stats) == s[0].execution_count, s[0]
        everything = client.get_inference_statistics(headers=auth).model_stats
        assert [m.name for m in everything] == [MODEL], everything

    def repository_index():
        index = client.get_model_repository_index(headers=auth)
        assert [(m.name, m.version, m.state) for m in index.models] == [(MODEL, "1", "READY")], index

    def refusals():
        image, features = batch(1)
        wide = rng.standard_normal((9, 1, 28, 28), dtype=np.float32)  # max_batch_size 8
        refused(lambda: client.infer("no_such_model", inputs_of(image, features), headers=auth), "NOT_FOUND",
                "unknown model 'no_such_model'")
        refused(lambda: client.infer(MODEL, inputs_of(image, features)[:1], headers=auth), "INVALID_ARGUMENT",
                "lacks input 'INPUT__1'")
        refused(lambda: client.infer(MODEL, inputs_of(wide, features), headers=auth), "INVALID_ARGUMENT",
                "with at most 8 samples")
        refused(lambda: client.infer(MODEL, inputs_of(image, features), model_version="7", headers=auth), "NOT_FOUND",
                "has no version '7'")
        refused(lambda: client.infer(MODEL, inputs_of(image, features), priority=3, headers=auth), "INVALID_ARGUMENT",
                "'priority'")
        refused(lambda: client.get_model_metadata(MODEL), "UNAUTHENTICATED", "Bearer")
        refused(lambda: client.get_model_metadata(MODEL, headers={"authorization": "Bearer wrong"}), "UNAUTHENTICATED",
                "not this server's")
        refused(lambda: client.get_system_shared_memory_status(headers=auth), "UNIMPLEMENTED", "")

    check("health", health)
    check("server_metadata", server_metadata)
    check("model_metadata", model_metadata)
    check("model_config", model_config)
    check("infer", infer)
    check("requested_output_subset", requested_output_subset)
    check("typed_contents", typed_contents)
    check("async_infer", async_infer)
    check("asyncio_infer", asyncio_infer)
    check("statistics", statistics)
    check("repository_index", repository_index)
    check("refusals", refusals)
    client.close()
    print(json.dumps({"tritonclient": metadata.version("tritonclient"), "grpcio": grpc.__version__, "checks": checks}))


def partial_callback(done, i):
    return lambda result, error: done.put((i, result, error))


if __name__ == "__main__":
    main()
