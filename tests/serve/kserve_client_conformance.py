"""KServe's own Python SDK clients (kserve.InferenceRESTClient with the v2 protocol, and
kserve.InferenceGRPCClient) against lockstep serve: the client a KServe user already has, which
differs from tritonclient in its request types (kserve.InferRequest), its asyncio-only API, its
REST binary extension and its gRPC stubs (KServe's own grpc_predict_v2 protos).

Usage: python kserve_client_conformance.py TARGET MODEL_FILE TOKEN
  TARGET: http://HOST:PORT/ (REST) or HOST:PORT (gRPC) of a server whose repository holds
  MODEL_FILE as model 'two_input' (tests/python/torchscript_serving_models.py's two_input.pt:
  INPUT__0 (B,1,28,28) FP32, INPUT__1 (B,8) FP32 -> OUTPUT__0 (B,10) FP32, OUTPUT__1 (B,1) INT64),
  guarded by the bearer TOKEN. The expected outputs are the module's own, run here by torch.
Prints one JSON line: {"kserve": VERSION, "protocol": "rest" or "grpc", "checks": {NAME: "ok" or what
went wrong}}.

What its first run (2026-12-02, kserve 0.21.0) found, and what became of it:
- REST health: InferenceRESTClient.is_server_live/ready parse the body as the KServe v2 spec's
  {"live": true} / {"ready": true}; lockstep answered 200 with an empty body, as Triton does
  (JSONDecodeError). lockstep now sends those bodies.
- gRPC raw contents: InferenceGRPCClient's requests carry a binary_data_size parameter on each
  input beside raw_input_contents, which lockstep's gRPC service refused (INVALID_ARGUMENT
  "parameter(s) 'binary_data_size' are not supported"). It is now read as a check on those bytes.
- REST JSON bodies "cut short" (400 "malformed JSON ... unexpected end of input" at column 268):
  not a cut. InferenceRESTClient.infer writes Inference-Header-Content-Length into the headers
  dict its caller passes, so a dict shared with an earlier binary request makes later JSON
  requests declare a 268-byte JSON header; lockstep answered them as Triton does. Each call here
  gets a dict of its own.
"""
import asyncio
import json
import sys
from importlib import metadata

import numpy as np
import torch
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

from client_checks import run_check

MODEL = "two_input"
TOLERANCE = 1e-5  # the same module on the same kernels; batching changes only float32 rounding
TIMEOUT_S = 30


def request_of(image, features, binary):
    a = InferInput("INPUT__0", list(image.shape), "FP32")
    a.set_data_from_numpy(image, binary_data=binary)
    b = InferInput("INPUT__1", list(features.shape), "FP32")
    b.set_data_from_numpy(features, binary_data=binary)
    return InferRequest(model_name=MODEL, infer_inputs=[a, b])


async def run(target, module, token):
    rest = target.startswith("http")
    rng = np.random.default_rng(7)
    checks = {}

    def expected(image, features):
        with torch.no_grad():
            logits, cls = module(torch.from_numpy(image), torch.from_numpy(features))
        return logits.numpy(), cls.numpy()

    def check_response(response, image, features):
        outputs = {o.name: o.as_numpy() for o in response.outputs}
        assert sorted(outputs) == ["OUTPUT__0", "OUTPUT__1"], sorted(outputs)
        want_logits, want_class = expected(image, features)
        np.testing.assert_allclose(outputs["OUTPUT__0"].reshape(want_logits.shape), want_logits, rtol=0,
                                   atol=TOLERANCE)
        np.testing.assert_array_equal(outputs["OUTPUT__1"].reshape(want_class.shape).astype(np.int64), want_class)

    async def check(name, body):  # run_check's report, for a coroutine
        error = None
        try:
            await asyncio.wait_for(body(), TIMEOUT_S)
        except Exception as e:  # reported by run_check, with its traceback
            error = e

        def outcome():
            if error is not None:
                raise error
        run_check(checks, name, outcome)

    def batch(n):
        return (rng.standard_normal((n, 1, 28, 28), dtype=np.float32), rng.standard_normal((n, 8), dtype=np.float32))

    if rest:
        client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=TIMEOUT_S))

        def headers():  # a new dict a call: see the module's docstring
            return {"Authorization": "Bearer " + token}

        async def health():
            assert await client.is_server_live(target)
            assert await client.is_server_ready(target)
            assert await client.is_model_ready(target, MODEL, headers=headers())

        async def infer(binary):
            image, features = batch(3)
            response = await client.infer(target, request_of(image, features, binary), model_name=MODEL,
                                          headers=headers())
            check_response(response, image, features)

        async def concurrent():
            batches = [batch(1 + k % 3) for k in range(12)]
            responses = await asyncio.gather(*(client.infer(target, request_of(i, f, False), model_name=MODEL,
                                                            headers=headers()) for i, f in batches))
            for r, (i, f) in zip(responses, batches):
                check_response(r, i, f)

        async def refused_without_token():
            image, features = batch(1)
            try:
                await client.infer(target, request_of(image, features, False), model_name=MODEL)
            except Exception as e:  # httpx.HTTPStatusError, raised by the client for a 4xx
                assert "401" in str(e), e
            else:
                raise AssertionError("an infer without the token was answered")

        async def unknown_model():
            assert not await client.is_model_ready(target, "no_such_model", headers=headers())

        await check("health", health)
        await check("infer_json", lambda: infer(False))
        await check("infer_binary", lambda: infer(True))
        await check("infer_12_at_once", concurrent)
        await check("refused_without_token", refused_without_token)
        await check("unknown_model_not_ready", unknown_model)
        await client.close()
    else:
        client = InferenceGRPCClient(target, timeout=TIMEOUT_S, retries=0)
        metadata_auth = (("authorization", "Bearer " + token),)

        async def health():
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready(MODEL, headers=metadata_auth)

        async def infer(binary):
            image, features = batch(3)
            check_response(await client.infer(request_of(image, features, binary), headers=metadata_auth),
                           image, features)

        async def concurrent():
            batches = [batch(1 + k % 3) for k in range(12)]
            responses = await asyncio.gather(*(client.infer(request_of(i, f, True), headers=metadata_auth)
                                               for i, f in batches))
            for r, (i, f) in zip(responses, batches):
                check_response(r, i, f)

        async def refused_without_token():
            image, features = batch(1)
            try:
                await client.infer(request_of(image, features, True))
            except Exception as e:  # grpc.aio.AioRpcError
                assert "UNAUTHENTICATED" in str(e), e
            else:
                raise AssertionError("an infer without the token was answered")

        async def unknown_model():
            try:
                ready = await client.is_model_ready("no_such_model", headers=metadata_auth)
            except Exception as e:  # NOT_FOUND, as Triton answers it
                assert "NOT_FOUND" in str(e), e
            else:
                assert not ready

        await check("health", health)
        await check("infer_typed_contents", lambda: infer(False))
        await check("infer_raw_contents", lambda: infer(True))
        await check("infer_12_at_once", concurrent)
        await check("refused_without_token", refused_without_token)
        await check("unknown_model_not_ready", unknown_model)
        await client.close()
    return {"kserve": metadata.version("kserve"), "protocol": "rest" if rest else "grpc", "checks": checks}


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: python kserve_client_conformance.py TARGET MODEL_FILE TOKEN")
    target, model_file, token = sys.argv[1:]
    module = torch.jit.load(model_file).eval()
    print(json.dumps(asyncio.run(run(target, module, token))))


if __name__ == "__main__":
    main()
