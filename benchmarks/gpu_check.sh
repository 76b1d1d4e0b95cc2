#!/usr/bin/env bash
# What only a GPU can check, in one run on a CUDA machine (a benchmark, not CI):
#   1. the engine's equivalence tests on CUDA (float32, each attention backend that is installed),
#      and the real-mode CLI tests there (bf16, CUDA overlap on a forward stream);
#   2. real-engine throughput with overlap on and off, device idle share, and decode at
#      batch 1 against the floor (weight bytes / HBM bandwidth) (benchmarks/engine_throughput.py);
#      where the host's time in a launch goes with overlap on and off (benchmarks/cuda_overlap_probe.py);
#   3. `testbed calibrate` of this GPU (llama-3.1-8b, dummy weights) and that profile against
#      the AIConfigurator profile of the same GPU, shape by shape (benchmarks/gpu_profile_compare.py);
#   4. the simulator with that profile against the real engine on traces it was not made from
#      (benchmarks/fidelity.py);
#   5. `testbed serve` on this GPU and `replay --mode server` against it, beside `--mode real` on the
#      same trace (tests/testbed/live/; needs aiohttp, from .whl/ where the machine has none);
#   6. a mixture-of-experts model (qwen3-30b-a3b, MOE_MODEL) replayed on the real engine;
#   7. the linear layers' GEMMs of Llama-3.1-8B and -70B, bf16 and fp8, timed on this GPU
#      (benchmarks/gpu_gemm_times.py, step gemm-times, $OUT/gemm-times.csv): on a machine with
#      aiconfigurator-core, benchmarks/gpu_gemm_compare.py sets the database's times of the same
#      GEMMs beside them, and both beside the spec's floor.
#
#     bash benchmarks/gpu_check.sh            # results in $OUT (default runs/gpu-check)
#     DEVICE=cpu MODEL=tiny-llama HARDWARE=cpu bash benchmarks/gpu_check.sh    # a dry run of the script here
#
# Wheels in .whl/ (simpy, and transformers >= 5 with its needs where the machine's is older)
# are installed into /tmp/site first; ../shared/traces is taken from ./shared/traces when the
# checkout has no ../shared. Each step has its own time limit and the run goes on past a
# failed one: all steps' logs end up in $OUT/gpu_check.log, and the last lines say which passed.
# LIMITS="step=seconds ..." overrides steps' limits (LIMITS="overlap-probe=90 fidelity=120").
# $OUT gets five files at most (the device tool brings back eight): gpu_check.log, gemm-times.csv,
# calibrated-$MODEL.json, profile-compare.json, fidelity.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
rm -f "$OUT/gpu_check.log"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -d ../shared/traces ] || { [ -d shared/traces ] && mkdir -p ../shared && cp -r shared/traces ../shared/; }
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
LOGS=$(mktemp -d)
MODEL=${MODEL:-llama-3.1-8b}
MOE_MODEL=${MOE_MODEL:-qwen3-30b-a3b}
# The bundled spec and AIConfigurator profile of the GPU this runs on (an H200 or else an H100's).
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU_NAME" in
  *H200*) GPU_SPEC=h200 ;;
  *) GPU_SPEC=h100 ;;
esac
KERNELS=${KERNELS:-profiles/${GPU_SPEC}_sxm-sglang-llama-3.1-8b-tp1.json}
HARDWARE=${HARDWARE:-$GPU_SPEC}
RESULTS=()

step() {  # step NAME SECONDS COMMAND...: run it (unless $SKIP names it), log it, print its tail
  local name=$1 limit=$2 kv
  shift 2
  for kv in ${LIMITS:-}; do [ "${kv%%=*}" = "$name" ] && limit=${kv#*=}; done
  case " ${SKIP:-} " in *" $name "*) echo "=== $name: skipped"; return;; esac
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-15}" "$LOGS/$name.log"
  { echo "=== $name: exit $rc"; cat "$LOGS/$name.log"; } >>"$OUT/gpu_check.log"
  echo "--- $name: exit $rc in $((SECONDS - t0)) s"
  RESULTS+=("$name: exit $rc, $((SECONDS - t0)) s")
}

step info 60 bash -c "nvidia-smi; $PY -c 'import torch, transformers, sys; print(sys.version); print(\"torch\", torch.__version__, torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else \"no CUDA device\"); print(\"transformers\", transformers.__version__)'; $PY -c 'import flashinfer' 2>&1 | tail -1"
TAIL=8 step gemm-times 120 $PY benchmarks/gpu_gemm_times.py --device "$DEVICE" $([ "$DEVICE" = cpu ] && echo --quick) \
  --out "$OUT/gemm-times.csv"

backends=(torch)
$PY -c 'import flashinfer' 2>/dev/null && backends+=(flashinfer)
for backend in "${backends[@]}"; do
  TAIL=6 TESTBED_TEST_DEVICE=$DEVICE TESTBED_TEST_ATTENTION=$backend \
    step "equivalence-$DEVICE-$backend" 150 $PY -m pytest -q -p no:cacheprovider tests/engine/test_engine_equivalence.py tests/engine/test_engine_sampler.py tests/engine/test_moe_equivalence.py
done
step calibrate 180 $PY -m testbed calibrate --model "$MODEL" --hardware "$HARDWARE" --out "$OUT/calibrated-$MODEL.json"
if [ -f "$OUT/calibrated-$MODEL.json" ]; then
  TAIL=4 step profile-compare 60 $PY benchmarks/gpu_profile_compare.py "$OUT/calibrated-$MODEL.json" "$KERNELS" --json "$OUT/profile-compare.json"
fi
TAIL=40 step overlap-probe 150 $PY benchmarks/cuda_overlap_probe.py --model "$MODEL"
TAIL=6 step real-cli 150 $PY -m pytest -q -p no:cacheprovider tests/engine/test_engine_replay.py
if [ -f "$OUT/calibrated-$MODEL.json" ]; then
  TAIL=12 step fidelity 150 $PY benchmarks/fidelity.py --device "$DEVICE" --model "$MODEL" --hardware "$HARDWARE" \
    --profile "$OUT/calibrated-$MODEL.json" --repeats 1 --overlap on -n "${FIDELITY_REQUESTS:-60}" \
    --traces gen-chat,azure-code --out "$OUT/fidelity"
  cp "$OUT/fidelity/fidelity.json" "$OUT/fidelity.json" 2>/dev/null
  rm -rf "$OUT/fidelity"  # its run folders: too many files to bring back; fidelity.json has the figures
fi
TAIL=6 step serve 150 $PY -m pytest -q -p no:cacheprovider -rA tests/testbed/live/test_serve.py
step throughput 120 $PY benchmarks/engine_throughput.py -n "${THROUGHPUT_REQUESTS:-64}" --hi "${THROUGHPUT_HI:-512}" \
  --model "$MODEL" --device "$DEVICE" --order on,off,on,off
# A mixture-of-experts model on the real engine: routing, grouped experts in eager extends and
# decodes (no graphs: the graph-safe path runs every expert for every token), bf16, dummy weights.
step moe-real 150 bash -c "$PY -m testbed trace gen --out $LOGS/moe-trace.json -n 16 --rate 4 --input-len uniform:64,1024 --output-len 32 \
  && $PY -m testbed replay $LOGS/moe-trace.json --mode real --model $MOE_MODEL --device $DEVICE --disable-cuda-graph --out $LOGS/moe-run"

echo "=== summary"
printf '%s\n' "${RESULTS[@]}" | tee -a "$OUT/gpu_check.log"
