#!/usr/bin/env bash
# Serving throughput and latency: `lockstep serve` (dynamic batching) against the Python peer
# (bench/serve_peer.py, shared/peer's plus --compile: FastAPI + uvicorn + PyTorch, one forward per
# request), both serving the same convnet weights with the same intra-op thread count, both driven
# by Debian's `hey` with the same batch-1 KServe v2 JSON request at concurrency 1, 8 and 32. Every
# round runs each concurrency on every server, alternating; the table gives medians over the
# rounds: requests/s, p50 and p99 latency (ms), and the requests that did not get a 200.
# COMPILE=1 adds the peer with torch.compile (compiled before it says ready).
# PEER_BEFORE=PYTHON adds the peer run by another Python (/usr/bin/python3: Debian's torch 1.13,
# with python3-fastapi and python3-uvicorn).
# Usage: [ROUNDS=3] [PEER_DIR=bench] bench/serve_vs_peer.sh [REQUESTS=2000] [THREADS=1]
#        (after make build and scripts/bootstrap --test: hey, and the venv's torch, fastapi, uvicorn)
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-2000}; threads=${2:-1}; rounds=${ROUNDS:-3}
cli=${LOCKSTEP:-build/lockstep}
peer_dir=$(cd "${PEER_DIR:-bench}" && pwd)
python=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}   # the venv's (requirements.txt)
[[ -x $cli ]] || { echo "no $cli: run make build first" >&2; exit 1; }
command -v hey >/dev/null || { echo "hey missing: run scripts/bootstrap --test" >&2; exit 1; }
for py in "$python" ${PEER_BEFORE:+"$PEER_BEFORE"}; do
  $py -c 'import torch, fastapi, uvicorn' 2>/dev/null ||
    { echo "the peer needs torch, fastapi and uvicorn in $py: run scripts/bootstrap --test" >&2; exit 1; }
done
(( requests >= 32 )) || { echo "REQUESTS must be at least 32 (the highest concurrency), not $requests" >&2; exit 2; }

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { $python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {  # URL NAME LOG
  for _ in $(seq 600); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "$1" || true) == 200 ]] && return 0
    sleep 0.1
  done
  echo "$2 did not become ready within 60 s:" >&2; cat "$3" >&2; exit 1
}

# Weights from a short synthetic training run (throughput does not depend on their values).
"$cli" train --quiet --model convnet --data synthetic --limit 200 --batch-size 50 --save-model "$work/convnet.pt" >/dev/null
# One batch-1 request: a 28x28 image of values in [-1, 1].
$python -c 'import json; print(json.dumps({"inputs":[{"name":"input","shape":[1,1,28,28],"datatype":"FP32",
  "data":[((i * 37) % 255) / 127.5 - 1 for i in range(784)]}]}))' >"$work/request.json"

declare -A url port
servers=(lockstep peer)
[[ -n ${COMPILE:-} ]] && servers+=(peer-compiled)
[[ -n ${PEER_BEFORE:-} ]] && servers+=(peer-before)
for server in "${servers[@]}"; do port[$server]=$(free_port); done
metrics_port=$(free_port)
OMP_NUM_THREADS=$threads "$cli" serve --model convnet --weights "$work/convnet.pt" --threads "$threads" \
  --http-address 127.0.0.1 --http-port "${port[lockstep]}" --metrics-port "$metrics_port" \
  --grpc-port 0 >"$work/lockstep.log" 2>&1 &
pids+=($!)
start_peer() {  # SERVER PYTHON EXTRA...
  local server=$1 py=$2; shift 2
  (cd "$peer_dir" && OMP_NUM_THREADS=$threads exec $py serve_peer.py --weights "$work/convnet.pt" \
    --port "${port[$server]}" --threads "$threads" "$@") >"$work/$server.log" 2>&1 &
  pids+=($!)
}
start_peer peer "$python"
[[ -n ${COMPILE:-} ]] && start_peer peer-compiled "$python" --compile
[[ -n ${PEER_BEFORE:-} ]] && start_peer peer-before "$PEER_BEFORE"
for server in "${servers[@]}"; do
  url[$server]="http://127.0.0.1:${port[$server]}/v2/models/convnet/infer"
  wait_ready "http://127.0.0.1:${port[$server]}/v2/health/ready" "$server" "$work/$server.log"
done
[[ -n ${PEER_BEFORE:-} ]] && echo "peer-before: $PEER_BEFORE, torch $($PEER_BEFORE -c 'import torch; print(torch.__version__)')"
echo "peer: $python, torch $($python -c 'import torch; print(torch.__version__)')"

# Every server answers the request with lockstep's logits (same weights, same model), to 1e-4.
for server in "${servers[@]}"; do
  curl -s -X POST -H 'Content-Type: application/json' --data-binary @"$work/request.json" "${url[$server]}" \
    >"$work/$server.reply"
  $python - "$work/lockstep.reply" "$work/$server.reply" "$server" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(f))["outputs"][0]["data"] for f in sys.argv[1:3])
if len(a) != len(b) or max(abs(x - y) for x, y in zip(a, b)) > 1e-4:
    sys.exit(f"lockstep and {sys.argv[3]} disagree:\n{a}\n{b}")
PY
done

drive() {  # SERVER CONCURRENCY N -> "requests/s p50_ms p99_ms non_200"
  local out
  out=$(hey -n "$3" -c "$2" -m POST -T application/json -D "$work/request.json" "${url[$1]}")
  # hey sends N / CONCURRENCY requests per worker, rounded down: 1984 of 2000 at concurrency 32.
  awk -v total="$(( $3 / $2 * $2 ))" '
    /Requests\/sec:/ { rps = $2 }
    /50% in/ { p50 = $3 * 1000 }
    /99% in/ { p99 = $3 * 1000 }
    /\[200\]/ { ok = $2 }
    END { printf "%.1f %.2f %.2f %d\n", rps, p50, p99, total - ok }' <<<"$out"
}

for server in "${servers[@]}"; do drive "$server" 8 200 >/dev/null; done   # warm up every server
results=$work/results   # lines: server concurrency requests/s p50 p99 non_200
for round in $(seq "$rounds"); do
  for c in 1 8 32; do
    for server in "${servers[@]}"; do echo "$server $c $(drive "$server" "$c" "$requests")" >>"$results"; done
  done
done

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "convnet, batch-1 JSON requests, $requests per run, $threads intra-op thread(s) each, $rounds rounds (medians),"
bench/machine.sh "${COMPILE:+COMPILE=1 }${PEER_BEFORE:+PEER_BEFORE=$PEER_BEFORE }ROUNDS=$rounds bench/serve_vs_peer.sh $requests $threads"
echo
echo '| concurrency | server | requests/s | p50 (ms) | p99 (ms) | non-200 | throughput vs peer |'
echo '|---|---|---|---|---|---|---|'
for c in 1 8 32; do
  peer_rps=$(awk -v c="$c" '$1 == "peer" && $2 == c { print $3 }' "$results" | median)
  for server in "${servers[@]}"; do
    col() { awk -v s="$server" -v c="$c" -v k="$1" '$1 == s && $2 == c { print $k }' "$results" | median; }
    rps=$(col 3)
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$c" "$server" "$rps" "$(col 4)" "$(col 5)" "$(col 6)" \
      "$(awk -v a="$rps" -v b="$peer_rps" 'BEGIN { printf "%.2fx", a / b }')"
  done
done
echo
grep -h 'READY' "$work/lockstep.log" || true
echo "lockstep peak RSS: $(awk '/VmHWM/ { print $2 / 1024 " MiB" }' /proc/"${pids[0]}"/status 2>/dev/null || echo '?')"
