#!/bin/bash
# Launch the peer (bench/fmnist_ddp.py) with N ranks by hand, as torchrun would set them up. PEER_PY
# picks the Python (default the project's venv, PyTorch 2.x; ../shared/peer/run_ddp.sh is the same
# for Debian's /usr/bin/python3 and its torch 1.13).
N=${N:-2}; PORT=${PORT:-29611}
py=${PEER_PY:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
for ((r=0; r<N; r++)); do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT WORLD_SIZE=$N RANK=$r LOCAL_RANK=$r OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
    "$py" "$(dirname "$0")/fmnist_ddp.py" "$@" &
done
wait
