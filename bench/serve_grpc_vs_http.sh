#!/usr/bin/env bash
# One `lockstep serve` (convnet, dynamic batching) driven three ways with the same batch-1 request:
# HTTP with a JSON body and with the binary tensor extension (Debian's `hey`), and gRPC with raw
# input contents (bench/grpc_load.cpp: a closed loop of CONCURRENCY calls on one channel; Triton's
# perf_analyzer is not on these machines' PyPI). Every round runs each concurrency with every client,
# alternating; the table gives medians over the rounds: requests/s, p50 and p99 latency (ms) and
# gRPC's throughput against HTTP binary's. The input is zeros: throughput does not depend on it.
# Usage: [ROUNDS=3] bench/serve_grpc_vs_http.sh [REQUESTS=4000] [THREADS=1]   (after make build)
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-4000}; threads=${2:-1}; rounds=${ROUNDS:-3}
cli=${LOCKSTEP:-build/lockstep}
python=.venv/bin/python
[[ -x $cli && -f build/generated/grpc_service.grpc.pb.cc ]] || { echo "run make build first" >&2; exit 1; }
command -v hey >/dev/null || { echo "hey missing: run scripts/bootstrap --test" >&2; exit 1; }
work=$(mktemp -d)
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

g++ -std=c++20 -O2 -o "$work/grpc_load" bench/grpc_load.cpp build/generated/grpc_service.pb.cc \
  build/generated/grpc_service.grpc.pb.cc -Ibuild/generated $(pkg-config --cflags --libs grpc++ protobuf) -pthread
"$cli" train --quiet --model convnet --data synthetic --limit 200 --batch-size 50 --save-model "$work/convnet.pt" >/dev/null
OMP_NUM_THREADS=$threads "$cli" serve --model convnet --weights "$work/convnet.pt" --threads "$threads" \
  --http-port 0 --metrics-port 0 --grpc-port 0 >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q 'gRPC on' "$work/serve.log" && break; sleep 0.1; done
http=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | head -1)
grpc=$(grep -o 'gRPC on [0-9.:]*' "$work/serve.log" | cut -d' ' -f3)
url="$http/v2/models/convnet/infer"
$python - "$work" <<'PY'
import json, struct, sys
work = sys.argv[1]
json.dump({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}]},
          open(f"{work}/request.json", "w"))
header = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 3136}}],
                     "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
open(f"{work}/request.bin", "wb").write(header + struct.pack("<784f", *([0.0] * 784)))
open(f"{work}/header_length", "w").write(str(len(header)))
PY
hey_run() {  # BODY CONCURRENCY N [HEADER] -> "requests/s p50_ms p99_ms failed"
  local out type=application/json extra=()
  [[ -n ${4:-} ]] && { type=application/octet-stream; extra=(-H "Inference-Header-Content-Length: $4"); }
  out=$(hey -n "$3" -c "$2" -m POST -T "$type" "${extra[@]}" -D "$1" "$url")
  awk -v total="$(( $3 / $2 * $2 ))" '/Requests\/sec:/ { rps = $2 } /50% in/ { p50 = $3 * 1000 }
    /99% in/ { p99 = $3 * 1000 } /\[200\]/ { ok = $2 }
    END { printf "%.1f %.2f %.2f %d\n", rps, p50, p99, total - ok }' <<<"$out"
}
drive() {  # CLIENT CONCURRENCY N
  case $1 in
    http-json) hey_run "$work/request.json" "$2" "$3" ;;
    http-binary) hey_run "$work/request.bin" "$2" "$3" "$(cat "$work/header_length")" ;;
    grpc) "$work/grpc_load" "$grpc" convnet input "$3" "$2" |
            $python -c 'import json,sys; r=json.load(sys.stdin); print(r["rps"], r["p50_ms"], r["p99_ms"], r["failed"])' ;;
  esac
}
clients=(http-json http-binary grpc)
for c in "${clients[@]}"; do drive "$c" 8 400 >/dev/null; done  # warm up
results=$work/results
for round in $(seq "$rounds"); do
  for conc in 1 8 32; do
    for c in "${clients[@]}"; do echo "$c $conc $(drive "$c" "$conc" "$requests")" >>"$results"; done
  done
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "convnet, batch-1 requests, $requests per run, $threads intra-op thread(s), $rounds rounds (medians),"
bench/machine.sh "ROUNDS=$rounds bench/serve_grpc_vs_http.sh $requests $threads"
echo
echo '| concurrency | client | requests/s | p50 (ms) | p99 (ms) | failed | vs HTTP binary |'
echo '|---|---|---|---|---|---|---|'
for conc in 1 8 32; do
  base=$(awk -v c="$conc" '$1 == "http-binary" && $2 == c { print $3 }' "$results" | median)
  for c in "${clients[@]}"; do
    col() { awk -v s="$c" -v n="$conc" -v k="$1" '$1 == s && $2 == n { print $k }' "$results" | median; }
    rps=$(col 3)
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$conc" "$c" "$rps" "$(col 4)" "$(col 5)" "$(col 6)" \
      "$(awk -v a="$rps" -v b="$base" 'BEGIN { printf "%.2fx", a / b }')"
  done
done
