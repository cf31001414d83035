#!/usr/bin/env python3
"""Hostile but realistic HTTP clients against a running `lockstep serve`, for
tests/serve/server_limits_test.cpp. Each mode prints one JSON object with what it measured.

Usage: http_clients.py MODE PORT [N]
  slowloris N    N connections each sending a header line every 0.2 s; meanwhile new clients ask
                 /v2/health/live. Reports the health latencies and how each slow connection ended.
  connections N  N idle connections (the server's limit), then one more; then one of the N hangs up.
  pipeline       three requests in one write on one connection, then a fourth.
  malformed      requests that are not HTTP/1.1, each on its own connection: status and time.
  idle N         N keep-alive connections left open after a request each; then a new client.
"""
import http.client
import json
import select
import socket
import statistics
import sys
import time

HOST = "127.0.0.1"


def read_response(f):
    """(status, headers, body) of one HTTP/1.1 response from a binary file object."""
    status_line = f.readline()
    if not status_line:
        return None
    status = int(status_line.split(b" ")[1])
    headers = {}
    while True:
        line = f.readline().rstrip(b"\r\n")
        if not line:
            break
        name, value = line.split(b":", 1)
        headers[name.decode().lower()] = value.strip().decode()
    body = f.read(int(headers.get("content-length", "0")))
    return status, headers, body


def health(port):
    """Milliseconds for a new client's GET /v2/health/live, and its status."""
    start = time.monotonic()
    c = http.client.HTTPConnection(HOST, port, timeout=10)
    c.request("GET", "/v2/health/live")
    r = c.getresponse()
    r.read()
    c.close()
    return (time.monotonic() - start) * 1000, r.status


def first_status(sock, timeout):
    """The status of the first response on `sock` within `timeout` s (0: closed without one), and ms."""
    start = time.monotonic()
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except OSError:
        data = b""
    ms = (time.monotonic() - start) * 1000
    return (int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else 0), ms


def slowloris(port, n):
    slow = [socket.create_connection((HOST, port)) for _ in range(n)]
    for s in slow:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    ended = {}  # index -> status the server answered before closing
    latencies = []
    failures = 0
    start = time.monotonic()
    while len(ended) < n and time.monotonic() - start < 30:
        for i, s in enumerate(slow):
            if i in ended:
                continue
            if select.select([s], [], [], 0)[0]:  # the server answered: do not write into a closed socket
                ended[i] = first_status(s, 1)[0]
            else:
                s.sendall(b"X-Slow: 1\r\n")
        ms, status = health(port)
        latencies.append(ms)
        failures += status != 200
        time.sleep(0.2)
    print(json.dumps({"connections": n, "health_requests": len(latencies), "health_ms_max": max(latencies),
                      "health_ms_median": statistics.median(latencies), "health_failures": failures, "seconds": time.monotonic() - start,
                      "ended_with": sorted(set(ended.values())), "ended": len(ended)}))


def connections(port, n):
    held = [socket.create_connection((HOST, port)) for _ in range(n)]
    extra = socket.create_connection((HOST, port))
    extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    over_limit, _ = first_status(extra, 10)
    held.pop().close()
    after = 0
    deadline = time.monotonic() + 10
    while after != 200 and time.monotonic() < deadline:  # until the server has seen the hang-up
        s = socket.create_connection((HOST, port))
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        after, _ = first_status(s, 10)
        s.close()
    print(json.dumps({"over_limit": over_limit, "after_one_closed": after}))


def pipeline(port):
    s = socket.create_connection((HOST, port))
    f = s.makefile("rb")
    start = time.monotonic()
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /v2/models/convnet HTTP/1.1\r\nHost: x\r\n\r\n")
    replies = [read_response(f) for _ in range(3)]
    ms = (time.monotonic() - start) * 1000
    s.sendall(b"GET /v2/models/convnet/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    fourth = read_response(f)
    print(json.dumps({"ms": ms, "statuses": [r[0] for r in replies] + [fourth[0]],
                      "bodies": [r[2].decode() for r in replies]}))


MALFORMED = {
    "http_0_9": b"GET /\r\n",
    "http_2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "tls_client_hello": bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]),
    "garbage": b"\x00\xff\xfe garbage",
    "header_100_kb": b"GET /v2/health/live HTTP/1.1\r\nX-Big: " + b"a" * 100_000,
    "two_content_lengths": b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}",
}


def malformed(port):
    out = {}
    for name, request in MALFORMED.items():
        s = socket.create_connection((HOST, port))
        try:
            s.sendall(request)
        except OSError:
            pass  # the server may refuse before the last byte
        status, ms = first_status(s, 10)
        s.close()
        out[name] = {"status": status, "ms": ms}
    print(json.dumps(out))


def idle(port, n):
    held = []
    for _ in range(n):
        c = http.client.HTTPConnection(HOST, port, timeout=10)
        c.request("GET", "/v2/health/live")
        c.getresponse().read()
        held.append(c)  # open, keep-alive, idle
    ms, status = health(port)
    print(json.dumps({"idle_connections": n, "ms": ms, "status": status}))


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    {"slowloris": lambda: slowloris(port, n), "connections": lambda: connections(port, n),
     "pipeline": lambda: pipeline(port), "malformed": lambda: malformed(port), "idle": lambda: idle(port, n)}[mode]()
