#!/usr/bin/env python3
"""Hostile but realistic gRPC clients against a running `lockstep serve --grpc-port`, for
tests/serve/server_limits_test.cpp. Each mode prints one JSON object with what it measured; after
each, the server must still answer (ServerLive and a ModelInfer of model 'convnet', 1x1x28x28 FP32).

Usage: grpc_clients.py MODE PORT [N]
  malformed      ModelInfer messages that are not protobuf, or are protobuf of the wrong shape (and,
                 beside them, binary_data_size parameters that do and do not fit the raw bytes),
                 and bytes that are not HTTP/2 on a bare TCP connection: each call's status and time.
  oversized N    one ModelInfer message of N bytes (above the server's limit), then a normal call.
  streams N      N ModelInfer calls started at once on one channel: how each ended, how long the
                 last took, and a ServerLive from a second channel meanwhile.
"""
import json
import socket
import sys
import threading
import time

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

HOST = "127.0.0.1"
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
TIMEOUT_S = 30


def infer_request(samples=1):
    r = service_pb2.ModelInferRequest(model_name="convnet")
    r.inputs.add(name="input", datatype="FP32", shape=[samples, 1, 28, 28])
    r.raw_input_contents.append(np.zeros((samples, 1, 28, 28), dtype=np.float32).tobytes())
    return r


def raw_call(channel, method, payload, timeout=TIMEOUT_S):
    """(status code name, details, ms) of one unary call whose request bytes are `payload` as sent."""
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    start = time.monotonic()
    try:
        call(payload, timeout=timeout)
        code, details = "OK", ""
    except grpc.RpcError as e:
        code, details = e.code().name, e.details()
    return code, details, round((time.monotonic() - start) * 1000, 1)


def still_serving(port):
    """Whether a fresh channel gets ServerLive and a convnet ModelInfer answered."""
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        live = raw_call(channel, LIVE, service_pb2.ServerLiveRequest().SerializeToString())
        infer = raw_call(channel, INFER, infer_request().SerializeToString())
    return live[0] == "OK" and infer[0] == "OK"


def malformed(port):
    wrong_shape = infer_request()
    wrong_shape.inputs[0].shape[:] = [1, 2**62, 2**62]  # would be 2^125 floats
    def sized(n):  # binary_data_size beside raw_input_contents, as KServe's client sends it
        r = infer_request()
        r.inputs[0].parameters["binary_data_size"].int64_param = n
        return r.SerializeToString()

    cases = {
        "binary_data_size_right": sized(784 * 4),
        "binary_data_size_wrong": sized(784 * 4 - 1),
        "truncated_varint": b"\x0a\xff\xff\xff",           # field 1, length that never ends
        "length_past_end": b"\x0a\x7f" + b"c",             # field 1 says 127 bytes, 1 follows
        "wrong_wire_type": b"\x0d\x00\x00\x00\x00",        # field 1 as fixed32, declared a string
        "random_bytes": bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)),
        "huge_shape": wrong_shape.SerializeToString(),
        "empty_message": b"",
    }
    out = {}
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        for name, payload in cases.items():
            code, details, ms = raw_call(channel, INFER, payload)
            out[name] = {"code": code, "details": details[:200], "ms": ms}
    for name, data in {"http1_request": b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
                       "bad_preface": b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\x00" * 64}.items():
        start = time.monotonic()
        with socket.create_connection((HOST, port), timeout=10) as s:
            s.sendall(data)
            try:
                reply = s.recv(65536)
                while s.recv(65536):
                    pass
            except OSError:
                reply = b""
        out[name] = {"closed_after_ms": round((time.monotonic() - start) * 1000, 1), "reply_bytes": len(reply)}
    out["still_serving"] = still_serving(port)
    return out


def oversized(port, n):
    payload = b"\x12" + encode_varint(n) + b"v" * n  # field 2 (model_version), n bytes
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"{HOST}:{port}", options=options) as channel:
        code, details, ms = raw_call(channel, INFER, payload)
    return {"bytes": len(payload), "code": code, "details": details[:200], "ms": ms,
            "still_serving": still_serving(port)}


def encode_varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def streams(port, n):
    payload = infer_request().SerializeToString()
    codes = {}
    lock = threading.Lock()
    done = threading.Event()
    remaining = [n]
    start = time.monotonic()
    last_ms = [0.0]

    def finished(future):
        code = future.code().name
        with lock:
            codes[code] = codes.get(code, 0) + 1
            remaining[0] -= 1
            last_ms[0] = (time.monotonic() - start) * 1000
            if remaining[0] == 0:
                done.set()

    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        call = channel.unary_unary(INFER, request_serializer=None, response_deserializer=None)
        futures = [call.future(payload, timeout=120) for _ in range(n)]
        for f in futures:
            f.add_done_callback(finished)
        with grpc.insecure_channel(f"{HOST}:{port}") as other:
            probe = raw_call(other, LIVE, service_pb2.ServerLiveRequest().SerializeToString(), timeout=10)
        done.wait(150)
    return {"calls": n, "codes": codes, "all_ms": round(last_ms[0], 1), "probe_code": probe[0], "probe_ms": probe[2],
            "still_serving": still_serving(port)}


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    result = {"malformed": lambda: malformed(port), "oversized": lambda: oversized(port, n),
              "streams": lambda: streams(port, n)}[mode]()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
