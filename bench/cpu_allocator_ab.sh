#!/usr/bin/env bash
# The caching CPU allocator (Note [Caching large CPU blocks]) against glibc's heap as configured
# before it (LOCKSTEP_CPU_ALLOCATOR=glibc), in alternating runs of the same training: time, samples/s,
# peak RSS (rank 0), minor page faults and kernel time (all processes of the run, /usr/bin/time).
# Prints one row per run and the medians per configuration and allocator.
#
#   RUNS=5 bench/cpu_allocator_ab.sh          # LOCKSTEP=build/lockstep by default
set -euo pipefail
cd "$(dirname "$0")/.."
LOCKSTEP=${LOCKSTEP:-build/lockstep}
RUNS=${RUNS:-5}
PY=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}

# name | ranks | flags
CONFIGS=(
  "convnet local fp32|1|--model convnet --data synthetic --limit 6000"
  "mlp-wide zero2 fp32|2|--model mlp-wide --data synthetic --limit 4000 --strategy zero2"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include apps || echo ' (with uncommitted changes)')"
for config in "${CONFIGS[@]}"; do
  IFS='|' read -r name ranks flags <<<"$config"
  for run in $(seq "$RUNS"); do
    for allocator in caching glibc; do
      # shellcheck disable=SC2086
      if [[ "$ranks" == 1 ]]; then
        LOCKSTEP_CPU_ALLOCATOR=$allocator /usr/bin/time -f '%R %S' -o "$work/time" \
          $LOCKSTEP train $flags --epochs 1 --quiet | tail -n 1 >"$work/run.json"
      else
        LOCKSTEP_CPU_ALLOCATOR=$allocator /usr/bin/time -f '%R %S' -o "$work/time" \
          $LOCKSTEP run --nproc-per-node "$ranks" -- $LOCKSTEP train $flags --epochs 1 --quiet \
          | sed -n 's/^\[rank 0\] \({.*\)$/\1/p' | tail -n 1 >"$work/run.json"
      fi
      $PY - "$work/run.json" "$work/time" "$name" "$allocator" "$run" <<'PYEOF'
import json, sys
run = json.load(open(sys.argv[1]))
faults, sys_s = open(sys.argv[2]).read().split()[-2:]
print("\t".join([sys.argv[3], sys.argv[4], sys.argv[5], f'{run["train_s"]:.2f}', f'{run["samples_per_s"]:.0f}',
                 f'{run["peak_rss_mib"]:.0f}', faults, sys_s]))
PYEOF
    done
  done
done | tee "$work/rows"
echo
$PY - "$work/rows" <<'PYEOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
print("| configuration | allocator | runs | train s | samples/s | peak RSS rank 0 (MiB) | minor faults | kernel s |")
print("|---|---|---|---|---|---|---|---|")
for name in dict.fromkeys(r[0] for r in rows):
    for allocator in ("caching", "glibc"):
        sel = [r for r in rows if r[0] == name and r[1] == allocator]
        med = lambda i: statistics.median(float(r[i]) for r in sel)
        rss = [float(r[5]) for r in sel]
        print(f"| {name} | {allocator} | {len(sel)} | {med(3):.2f} | {med(4):.0f} | {med(5):.0f} ({min(rss):.0f}-{max(rss):.0f}) | {med(6):.0f} | {med(7):.2f} |")
    c = [r for r in rows if r[0] == name and r[1] == "caching"]
    g = [r for r in rows if r[0] == name and r[1] == "glibc"]
    ratios = [float(a[3]) / float(b[3]) for a, b in zip(c, g)]
    print(f"| {name} | caching/glibc train s, per alternating pair | | median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | | | | |")
PYEOF
