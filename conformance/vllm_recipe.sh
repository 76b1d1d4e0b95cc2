#!/bin/bash
# Build the vLLM oracle's venv: vLLM 0.19.0's v1 scheduler on CPU torch (no CUDA, no weights).
#   bash conformance/vllm_recipe.sh [VENV]     (default .conformance-vllm-venv, from the repo root)
# Then, from the repo root:  VENV/bin/python -m conformance.vllm_main --seed 0 --scenarios 300
# Every package comes from conformance/vllm_requirements.txt, pinned, installed with --no-deps and
# -c constraints-cpu.txt (torch==2.13.0: the local CPU build, never a CUDA one). The repository's
# own `scheduler` package is imported from the repo root (python -m puts it on sys.path): it needs
# only numpy, which the list holds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
V=${1:-$ROOT/.conformance-vllm-venv}
start=$(date +%s)
test -x "$V/bin/python" || python3.11 -m venv "$V"
# (pip's notes that a configured index folder lacks a package are noise: filtered out)
"$V/bin/python" -m pip install -q --no-deps -c "$ROOT/constraints-cpu.txt" -r "$ROOT/conformance/vllm_requirements.txt" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# Smoke test: vLLM's scheduler and ours import side by side.
(cd "$ROOT" && PYTHONHASHSEED=0 "$V/bin/python" -c "
import vllm, torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from scheduler.vllm.scheduler import VllmScheduler
assert vllm.__version__.startswith('0.19.0'), vllm.__version__
assert not torch.version.cuda, 'a CUDA torch came in'
print('vllm', vllm.__version__, 'torch', torch.__version__)
")
touch "$V/.installed"
echo "built $V in $(( $(date +%s) - start )) s"
