#!/usr/bin/env bash
# The serving peers' Python environment (.venv-peers), apart from the project's venv because
# nvidia-pytriton 0.7 requires numpy < 2 and the project's torch 2.14 stack has numpy 2. It holds
# PyTriton (whose wheel carries Triton's own tritonserver 2.51 and its Python backend) and TorchServe
# with its model archiver; torch, tritonclient and the rest come from the project's venv through a
# .pth placed after this venv's own packages, so numpy 1.26 wins and the torch is the same one.
# Debian's /usr/bin/python3, as the project's venv: Triton's Python backend stub links Debian's
# libpython3.11, and another 3.11's standard library beside it fails (RLock._recursion_count).
# Usage: bench/peers_env.sh       (after scripts/bootstrap --test; needs PyPI and Java 17 for TorchServe)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/.venv-peers
project_site=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check nvidia-pytriton==0.7.0 torchserve==0.12.0 \
  torch-model-archiver==0.12.0 "numpy==1.26.4"
peers_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$project_site" >"$peers_site/zz_project_venv.pth"
"$venv/bin/python" -c 'import numpy, torch, pytriton, ts
print("peers: numpy", numpy.__version__, "torch", torch.__version__)'
