#!/usr/bin/env bash
# `lockstep serve` against the servers a Triton or TorchServe user would run instead, all serving the
# same TorchScript convnet file with dynamic batching, the same intra-op thread count, on this machine:
#   lockstep   a Triton-layout repository (platform pytorch_libtorch, max_batch_size 64)
#   triton     Triton's own tritonserver 2.51 through PyTriton 0.7 (bench/triton_peer.py: the forward in
#              a Python callable behind Triton's dynamic batcher, max_batch_size 64, no queue delay)
#   torchserve TorchServe 0.12, the file in a .mar with BaseHandler (bench/torchserve_handler.py adds
#              the raw-tensor preprocess), one worker, batchSize 32, maxBatchDelay 1 ms (with 0 every batch-1
#              request took 107 ms at concurrency 1)
# Load: batch-1 requests at concurrency 1, 8 and 32, over HTTP with the binary tensor and over gRPC
# (ModelInfer with raw input contents). LOAD=perf_analyzer (the default): Triton's own perf_analyzer
# 2.51 (requirements-perf-analyzer.txt) for lockstep and Triton, 4 s windows until three agree within
# 10%; LOAD=ours: Debian's `hey` (KServe v2 binary) and bench/grpc_load.cpp, REQUESTS per run.
# TorchServe speaks neither protocol (its gRPC is its own service): `hey` sends it the same 3136
# float32 bytes to /predictions/convnet under either LOAD. Each round starts every server alone in
# turn (a different one first each round), runs every concurrency and protocol on it and stops it;
# medians over the rounds of requests/s, p50/p99 (ms) and failures, and the server's resident memory (the whole process tree: Triton's stub and PyTriton's
# Python process, TorchServe's Java front end and its worker) after the round.
# Usage: [ROUNDS=3] [LOAD=perf_analyzer|ours] bench/serve_vs_servers.sh [REQUESTS=4000] [THREADS=1]
#        (after make build, scripts/bootstrap --test and bench/peers_env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-4000}; threads=${2:-1}; rounds=${ROUNDS:-3}; load=${LOAD:-perf_analyzer}
pa_dir=$PWD/.venv/perf-analyzer
[[ $load == ours || -x $pa_dir/bin/perf_analyzer ]] || { echo "no $pa_dir/bin/perf_analyzer: run scripts/bootstrap --test, or LOAD=ours" >&2; exit 1; }
cli=${LOCKSTEP:-build/lockstep}
python=$PWD/.venv/bin/python
peers=$PWD/.venv-peers/bin
[[ -x $cli && -f build/generated/grpc_service.grpc.pb.cc ]] || { echo "run make build first" >&2; exit 1; }
command -v hey >/dev/null || { echo "hey missing: run scripts/bootstrap --test" >&2; exit 1; }
[[ -x $peers/torchserve ]] || { echo "no $peers/torchserve: run bench/peers_env.sh" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  $peers/torchserve --stop >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true; rm -rf "$work"
}
trap cleanup EXIT
free_port() { $python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_200() {  # URL NAME LOG
  for _ in $(seq 1200); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$1" || true) == 200 ]] && return 0
    sleep 0.1
  done
  echo "$2 did not answer 200 at $1 within 120 s:" >&2; tail -30 "$3" >&2; exit 1
}
tree_rss_mb() {  # PID -> resident MB of the process and all its descendants
  local all=$1 next=$1
  while next=$(ps -o pid= --ppid "$(tr ' ' ',' <<<"$next")" 2>/dev/null | xargs); [[ -n $next ]]; do
    all="$all $next"
  done
  ps -o rss= -p "$(tr ' ' ',' <<<"$all")" | awk '{ s += $1 } END { printf "%.0f\n", s / 1024 }'
}

g++ -std=c++20 -O2 -o "$work/grpc_load" bench/grpc_load.cpp build/generated/grpc_service.pb.cc \
  build/generated/grpc_service.grpc.pb.cc -Ibuild/generated $(pkg-config --cflags --libs grpc++ protobuf) -pthread
# One TorchScript file for all three (its weights do not change throughput).
mkdir -p "$work/repo/convnet/1" "$work/store"
(cd bench && $python -c 'import sys, torch; from fmnist_ddp import ConvNet
torch.manual_seed(0); torch.jit.script(ConvNet().eval()).save(sys.argv[1])' "$work/model.pt") 2>/dev/null
cp "$work/model.pt" "$work/repo/convnet/1/model.pt"
cat >"$work/repo/convnet/config.pbtxt" <<'EOF'
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "input" data_type: TYPE_FP32 dims: [ 1, 28, 28 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { }
EOF
$python - "$work" <<'PY'
import json, struct, sys
work = sys.argv[1]
sample = struct.pack("<784f", *[((i * 37) % 255) / 127.5 - 1 for i in range(784)])
header = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32",
                                 "parameters": {"binary_data_size": len(sample)}}],
                     "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
open(f"{work}/request.bin", "wb").write(header + sample)
open(f"{work}/sample.bin", "wb").write(sample)
open(f"{work}/header_length", "w").write(str(len(header)))
PY

declare -A http grpc
$peers/torch-model-archiver --model-name convnet --version 1 --serialized-file "$work/model.pt" \
  --handler bench/torchserve_handler.py --export-path "$work/store"
server=
start_server() {  # SERVER: started alone on fresh ports, answering the sample when this returns
  local s=$1 log=$work/$1.log
  http[$s]=$(free_port); grpc[$s]=$(free_port)
  case $s in
    lockstep)
      OMP_NUM_THREADS=$threads "$cli" serve --model-repository "$work/repo" --threads "$threads" --metrics-port 0 \
        --http-address 127.0.0.1 --http-port "${http[$s]}" --grpc-port "${grpc[$s]}" >"$log" 2>&1 & ;;
    triton)
      (cd bench && OMP_NUM_THREADS=$threads exec $peers/python triton_peer.py --model "$work/model.pt" \
        --http-port "${http[$s]}" --grpc-port "${grpc[$s]}" --metrics-port "$(free_port)" --threads "$threads") \
        >"$log" 2>&1 & ;;
    torchserve)
      cat >"$work/ts.properties" <<EOF2
inference_address=http://127.0.0.1:${http[$s]}
management_address=http://127.0.0.1:$(free_port)
metrics_address=http://127.0.0.1:$(free_port)
grpc_inference_port=$(free_port)
grpc_management_port=$(free_port)
disable_token_authorization=true
install_py_dep_per_model=false
model_store=$work/store
load_models=convnet.mar
models={"convnet":{"1":{"marName":"convnet.mar","minWorkers":1,"maxWorkers":1,"batchSize":32,"maxBatchDelay":1}}}
EOF2
      (cd "$work" && PATH=$peers:$PATH OMP_NUM_THREADS=$threads exec "$peers/torchserve" --start --foreground \
        --ncs --ts-config "$work/ts.properties" --model-store "$work/store") >"$log" 2>&1 & ;;
  esac
  server=$!; pids+=($!)
  if [[ $s == torchserve ]]; then
    wait_200 "http://127.0.0.1:${http[$s]}/ping" "$s" "$log"
    for _ in $(seq 600); do  # its worker loads the archive after the front end answers /ping
      curl -sf -o /dev/null -H "Content-Type: application/octet-stream" --data-binary @"$work/sample.bin" \
        "$(url "$s")" && return 0
      sleep 0.2
    done
    echo "torchserve's worker did not answer within 120 s:" >&2; tail -30 "$log" >&2; exit 1
  fi
  wait_200 "http://127.0.0.1:${http[$s]}/v2/models/convnet/ready" "$s" "$log"
}
stop_server() {  # SERVER
  [[ $1 == torchserve ]] && $peers/torchserve --stop >/dev/null 2>&1
  kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true
  sleep 1  # TorchServe's worker and Triton's stub leave after their parents; nothing else measures meanwhile
}
check_answer() {  # SERVER: its logits for the sample over each protocol it is driven by, against lockstep's
  $python - "$work" "$1" "${http[$1]}" "${grpc[$1]}" <<'PY'
import json, os, sys, urllib.request
import numpy as np, tritonclient.grpc as tg, tritonclient.http as th
work, server, http, grpc = sys.argv[1:]
sample = np.frombuffer(open(f"{work}/sample.bin", "rb").read(), np.float32).reshape(1, 1, 28, 28)
def ask(module, url):
    i = module.InferInput("input", [1, 1, 28, 28], "FP32"); i.set_data_from_numpy(sample)
    return module.InferenceServerClient(url).infer("convnet", [i]).as_numpy("logits").ravel()
if server == "torchserve":
    reply = urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{http}/predictions/convnet", data=sample.tobytes(),
        headers={"Content-Type": "application/octet-stream"})).read()
    got = {"http": np.array(json.loads(reply), np.float32).ravel()}
else:
    got = {"http": ask(th, f"127.0.0.1:{http}"), "grpc": ask(tg, f"127.0.0.1:{grpc}")}
ref_file = f"{work}/lockstep.logits.npy"
if not os.path.exists(ref_file):
    np.save(ref_file, got["http"])
ref = np.load(ref_file)
for proto, v in got.items():
    if v.shape != ref.shape or np.abs(v - ref).max() > 1e-5:
        sys.exit(f"{server} over {proto} answers {v}, lockstep {ref}")
PY
}

url() {  # SERVER -> the HTTP infer URL
  case $1 in torchserve) echo "http://127.0.0.1:${http[$1]}/predictions/convnet" ;;
             *) echo "http://127.0.0.1:${http[$1]}/v2/models/convnet/infer" ;; esac
}
drive() {  # SERVER PROTOCOL CONCURRENCY N -> "requests/s p50_ms p99_ms failed"
  local out
  if [[ $load == perf_analyzer && $1 != torchserve ]]; then  # it stops at a failed request: none failed
    local port=${http[$1]}; [[ $2 == grpc ]] && port=${grpc[$1]}
    rm -f "$work/pa.csv"
    LD_LIBRARY_PATH=$pa_dir/nvidia/cuda_runtime/lib "$pa_dir/bin/perf_analyzer" -m convnet -u "127.0.0.1:$port" \
      -i "$2" --concurrency-range "$3" --measurement-interval 4000 -f "$work/pa.csv" >"$work/pa.out" 2>&1 ||
      { echo "perf_analyzer failed against $1 over $2:" >&2; tail -20 "$work/pa.out" >&2; exit 1; }
    awk -F, 'NR == 2 { printf "%.1f %.2f %.2f 0\n", $2, $10 / 1000, $13 / 1000 }' "$work/pa.csv"
    return
  fi
  if [[ $2 == grpc ]]; then
    "$work/grpc_load" "127.0.0.1:${grpc[$1]}" convnet input "$4" "$3" |
      $python -c 'import json,sys; r=json.load(sys.stdin); print(r["rps"], r["p50_ms"], r["p99_ms"], r["failed"])'
    return
  fi
  if [[ $1 == torchserve ]]; then
    out=$(hey -n "$4" -c "$3" -m POST -T application/octet-stream -D "$work/sample.bin" "$(url "$1")")
  else
    out=$(hey -n "$4" -c "$3" -m POST -T application/octet-stream \
      -H "Inference-Header-Content-Length: $(cat "$work/header_length")" -D "$work/request.bin" "$(url "$1")")
  fi
  awk -v total="$(( $4 / $3 * $3 ))" '/Requests\/sec:/ { rps = $2 } /50% in/ { p50 = $3 * 1000 }
    /99% in/ { p99 = $3 * 1000 } /\[200\]/ { ok = $2 }
    END { printf "%.1f %.2f %.2f %d\n", rps, p50, p99, total - ok }' <<<"$out"
}
servers=(lockstep triton torchserve)
results=$work/results
for round in $(seq "$rounds"); do
  # Each round starts with another server, so none always runs first after the machine was idle.
  for k in 0 1 2; do
    s=${servers[$(( (round + k) % 3 ))]}
    start_server "$s"
    (( round == 1 )) && check_answer "$s"
    protocols=(http grpc); [[ $s == torchserve ]] && protocols=(http)
    for p in "${protocols[@]}"; do drive "$s" "$p" 8 400 >/dev/null; done  # warm up
    for conc in 1 8 32; do
      for p in "${protocols[@]}"; do
        echo "$s $p $conc $(drive "$s" "$p" "$conc" "$requests") $(tree_rss_mb "$server")" >>"$results"
      done
    done
    stop_server "$s"
  done
done
echo "every server answered lockstep's logits (1e-5) over each protocol it was driven by"
median() {  # of the numbers on stdin; nothing for none
  sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
per_run="$requests requests per run"
[[ $load == perf_analyzer ]] && per_run="perf_analyzer's 4 s windows (TorchServe: $requests requests per run)"
echo "convnet (TorchScript), batch-1 requests, $per_run, $threads intra-op thread(s)," \
  "$rounds rounds (medians),"
bench/machine.sh "ROUNDS=$rounds LOAD=$load bench/serve_vs_servers.sh $requests $threads"
echo "tritonserver $(awk '$2 == "server_version" { print $4; exit }' "$work/triton.log") (nvidia-pytriton" \
  "$($peers/python -c 'import importlib.metadata as m; print(m.version("nvidia-pytriton"))')), torchserve" \
  "$($peers/python -c 'import importlib.metadata as m; print(m.version("torchserve"))'), torch" \
  "$($python -c 'import torch; print(torch.__version__)'), load: $( [[ $load == perf_analyzer ]] &&
  LD_LIBRARY_PATH=$pa_dir/nvidia/cuda_runtime/lib "$pa_dir/bin/perf_analyzer" --version | head -1 ||
  echo "grpc_load (bench/)"), hey (Debian) for TorchServe$( [[ $load == ours ]] && echo " and HTTP")"
echo
echo '| concurrency | protocol | server | requests/s | p50 (ms) | p99 (ms) | failed | RSS (MB) | lockstep vs it |'
echo '|---|---|---|---|---|---|---|---|---|'
for conc in 1 8 32; do
  for proto in http grpc; do
    base=$(awk -v c="$conc" -v p="$proto" '$1 == "lockstep" && $2 == p && $3 == c { print $4 }' "$results" | median)
    for s in lockstep triton torchserve; do
      col() { awk -v s="$s" -v p="$proto" -v n="$conc" -v k="$1" '$1 == s && $2 == p && $3 == n { print $k }' \
                "$results" | median; }
      rps=$(col 4); [[ -z $rps ]] && continue
      printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$conc" "$proto" "$s" "$rps" "$(col 5)" "$(col 6)" \
        "$(col 7)" "$(col 8)" "$(awk -v a="$base" -v b="$rps" 'BEGIN { printf "%.2fx", a / b }')"
    done
  done
done
