#!/usr/bin/env bash
# Issue 33's measurements over shaped links: HOSTS network-namespace "hosts", each with RANKS ranks
# (one `lockstep run` per host), joined through a bridge in a "switch" namespace. Each host's link
# is shaped to RATE in both directions with tbf (a token bucket: BURST bytes above the rate at most).
# No delay is added: this machine's kernel has tbf and htb but no sch_netem, so the link's latency
# is the veth's own. Needs root (ip netns, tc).
#
#   bench/shaped_hosts.sh collectives OUT [bench flags]   # lockstep bench --collectives into OUT
#   bench/shaped_hosts.sh train [train flags]             # lockstep train; prints rank 0's summary line
#
# HOSTS (2), RANKS (2), RATE (1gbit), BURST (256kb), LOCKSTEP (build/lockstep).
set -euo pipefail
cd "$(dirname "$0")/.."
LOCKSTEP=$(realpath "${LOCKSTEP:-build/lockstep}")
HOSTS=${HOSTS:-2}
RANKS=${RANKS:-2}
RATE=${RATE:-1gbit}
BURST=${BURST:-256kb}
ID=$$
SWITCH=lsw-$ID

cleanup() {
  for h in $(seq 0 $((HOSTS - 1))); do ip netns del "lsh$h-$ID" 2>/dev/null || true; done
  ip netns del "$SWITCH" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$SWITCH"
ip -n "$SWITCH" link add lsbr type bridge
ip -n "$SWITCH" link set lsbr up
for h in $(seq 0 $((HOSTS - 1))); do
  ns=lsh$h-$ID
  ip netns add "$ns"
  ip link add "lsa$h-$ID" type veth peer name "lsb$h-$ID"
  ip link set "lsa$h-$ID" netns "$ns"
  ip link set "lsb$h-$ID" netns "$SWITCH"
  ip -n "$ns" link set "lsa$h-$ID" name lsnet
  ip -n "$ns" addr add "10.233.0.$((h + 1))/24" dev lsnet
  ip -n "$ns" link set lo up
  ip -n "$ns" link set lsnet up
  ip -n "$SWITCH" link set "lsb$h-$ID" master lsbr
  ip -n "$SWITCH" link set "lsb$h-$ID" up
  # latency: how long a packet may queue before tbf drops it.
  ip netns exec "$ns" tc qdisc add dev lsnet root tbf rate "$RATE" burst "$BURST" latency 100ms
  ip netns exec "$SWITCH" tc qdisc add dev "lsb$h-$ID" root tbf rate "$RATE" burst "$BURST" latency 100ms
done

what=$1
shift
if [ "$what" = collectives ]; then
  out=$(realpath -m "$1")
  shift
  mkdir -p "$out"
  program=("$LOCKSTEP" bench --collectives --out "$out" "$@")
else
  program=("$LOCKSTEP" train "$@")
fi
bench/machine.sh "HOSTS=$HOSTS RANKS=$RANKS RATE=$RATE BURST=$BURST bench/shaped_hosts.sh $what $*"
pids=()
for h in $(seq 0 $((HOSTS - 1))); do
  ip netns exec "lsh$h-$ID" "$LOCKSTEP" run --nnodes "$HOSTS" --node-rank "$h" --nproc-per-node "$RANKS" \
    --master-addr 10.233.0.1 --master-port 29500 --rdzv-timeout 60 --iface lsnet -- "${program[@]}" \
    > "/tmp/shaped-$ID-node$h.out" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
if [ "$what" = collectives ]; then
  grep -v '^\[rank [1-9]' "/tmp/shaped-$ID-node0.out" | sed 's/^\[rank 0\] //'
else
  grep -E 'process group|^\[rank 0\] \{' "/tmp/shaped-$ID-node0.out" | sed 's/^\[rank 0\] //'
fi
if [ "$status" -ne 0 ]; then
  tail -20 /tmp/shaped-$ID-node*.out >&2
fi
rm -f /tmp/shaped-$ID-node*.out
exit "$status"
