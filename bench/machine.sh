#!/usr/bin/env bash
# One line naming where and when a benchmark ran, printed above its results (docs/benchmarks.md
# names the machine of every figure): date, CPU model, cores, commit, and the command.
# Usage: bench/machine.sh "the command as typed"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
commit=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "machine: $(date -u +%Y-%m-%dT%H:%MZ), ${cpu:-CPU model unknown}, $(nproc) cores, commit $commit; command: $*"
