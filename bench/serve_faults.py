#!/usr/bin/env python3
"""Load and fault figures for docs/reliability.md ("Serving"): a running `lockstep serve` under
hostile clients, with its RSS sampled from /proc.

Usage: bench/serve_faults.py PORT PID MODE [N]
  slowloris N   N connections trickling header lines (0.5 s apart) while a probe asks
                /v2/health/live every 0.1 s; reports the probe latencies and how the slow ones ended.
  chunked N     one chunked body of N MiB of zeros to the infer route (curl); the answer and RSS.
  mixed N       N requests of mixed valid and invalid kinds, pipelined on keep-alive connections
                by 4 client processes (a framing error closes a connection: the client reconnects).
Prints one JSON object. The server needs the convnet under the name "convnet".
"""
import json
import multiprocessing
import socket
import statistics
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


class RssSampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.samples, self.running = pid, [], True

    def run(self):
        while self.running:
            self.samples.append(rss_mib(self.pid))
            time.sleep(0.2)


def probe(port):
    start = time.monotonic()
    s = socket.create_connection((HOST, port), timeout=10)
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = s.recv(4096)
    s.close()
    return (time.monotonic() - start) * 1000, data.startswith(b"HTTP/1.1 200")


def slowloris(port, pid, n):
    slow = []
    for _ in range(n):
        s = socket.create_connection((HOST, port))
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        s.setblocking(False)
        slow.append(s)
    ended, latencies, failures = {}, [], 0
    start, last_trickle = time.monotonic(), 0.0
    while len(ended) < n and time.monotonic() - start < 120:
        if time.monotonic() - last_trickle > 0.5:
            last_trickle = time.monotonic()
            for i, s in enumerate(slow):
                if i in ended:
                    continue
                try:
                    data = s.recv(4096)
                    ended[i] = int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else 0
                except BlockingIOError:
                    s.send(b"X-Slow: 1\r\n")
                except OSError:
                    ended[i] = 0
        ms, ok = probe(port)
        latencies.append(ms)
        failures += not ok
        time.sleep(0.1)
    latencies.sort()
    return {"connections": n, "probes": len(latencies), "probe_ms_median": statistics.median(latencies),
            "probe_ms_p99": latencies[int(0.99 * (len(latencies) - 1))], "probe_ms_max": latencies[-1],
            "probe_failures": failures, "slow_ended_with": {str(k): list(ended.values()).count(k)
                                                           for k in set(ended.values())},
            "seconds": time.monotonic() - start, "rss_mib": rss_mib(pid)}


def chunked(port, pid, mib):
    sampler = RssSampler(pid)
    before = rss_mib(pid)
    sampler.start()
    start = time.monotonic()
    r = subprocess.run(f"head -c {mib}M /dev/zero | curl -sS -o /dev/null -w '%{{http_code}}' -X POST "
                       f"-H 'Transfer-Encoding: chunked' -T - http://{HOST}:{port}/v2/models/convnet/infer",
                       shell=True, capture_output=True, text=True)
    sampler.running = False
    sampler.join()
    return {"mib_sent": mib, "status": r.stdout.strip(), "seconds": time.monotonic() - start,
            "rss_mib_before": before, "rss_mib_max": max(sampler.samples), "rss_mib_after": rss_mib(pid)}


def requests():
    image = "[" + ",".join(["0.5"] * 784) + "]"
    infer = lambda body: (b"POST /v2/models/convnet/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    good = ('{"inputs":[{"name":"input","shape":[1,1,28,28],"datatype":"FP32","data":%s}]}' % image).encode()
    valid = [
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2/models/convnet/stats HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2/nothing HTTP/1.1\r\nHost: x\r\n\r\n",
        infer(b'{"inputs": ['),
        infer(good.replace(b"[1,1,28,28]", b"[1,1,28,27]")),
        infer(good.replace(b"0.5]", b"1e39]")),
        infer(good),
        b"POST /v2/models/resnet/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    ]
    # A framing error: answered 400, then the server closes the connection.
    bad = b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    return valid, bad


def read_status(f):
    line = f.readline()
    if not line:
        return None
    length = 0
    while True:
        header = f.readline()
        if header in (b"\r\n", b""):
            break
        if header.lower().startswith(b"content-length:"):
            length = int(header.split(b":")[1])
    f.read(length)
    return int(line.split(b" ")[1])


def client(args):
    port, count, seed = args
    valid, bad = requests()
    counts, sent, connections = {}, 0, 0
    while sent < count:
        batch = [valid[(seed + sent + i) % len(valid)] for i in range(min(64, count - sent))]
        connections += 1
        if connections % 50 == 0:
            batch[-1] = bad
        s = socket.create_connection((HOST, port))
        f = s.makefile("rb")
        s.sendall(b"".join(batch))  # pipelined on one keep-alive connection
        for _ in batch:
            status = read_status(f)
            counts[status] = counts.get(status, 0) + 1
        sent += len(batch)
        s.close()
    return counts


def mixed(port, pid, n):
    sampler = RssSampler(pid)
    before = rss_mib(pid)
    sampler.start()
    start = time.monotonic()
    with multiprocessing.Pool(4) as pool:
        results = pool.map(client, [(port, n // 4, seed) for seed in range(4)])
    sampler.running = False
    sampler.join()
    counts = {}
    for r in results:
        for status, c in r.items():
            counts[str(status)] = counts.get(str(status), 0) + c
    return {"requests": sum(counts.values()), "by_status": counts, "seconds": time.monotonic() - start,
            "rss_mib_before": before, "rss_mib_max": max(sampler.samples), "rss_mib_after": rss_mib(pid),
            "alive": probe(port)[1]}


if __name__ == "__main__":
    port, pid, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    print(json.dumps({"slowloris": slowloris, "chunked": chunked, "mixed": mixed}[mode](port, pid, n)))
