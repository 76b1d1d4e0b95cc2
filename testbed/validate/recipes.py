"""Server settings that measured points ran with, where they differ from the engine's defaults
and the replay can take them.

InferenceMAX publishes each sweep's server command (SemiAnalysisAI/InferenceX,
benchmarks/single_node/<model>_<precision>_<gpu>.sh; benchmarks/*_docker.sh before 2026-01).
Of what those recipes set, the replay takes SGLang's --scheduler-recv-interval: every SGLang
DeepSeek-R1 recipe on the B200 and B300, fp8 and fp4, from 2025-11 (the file's first such
points) to 2026-04 (its last), runs `--scheduler-recv-interval 30` at 16 clients or more and 10
below, except the fp8 recipe at TP 4 (10 at every concurrency). Its points in silicon_sample.csv
are labelled DeepSeek-R1 or DeepSeek-V3 (the db-dump's rows of the same dsr1 sweeps).

Every vLLM Llama-3.1-70B recipe (fp8 on H100, H200 and B200, fp4 on B200) ran
`kv-cache-dtype: fp8` until the model left the sweeps on 2025-10-29, the date of its points; the
SGLang DeepSeek-R1 recipes on B200 and B300 run `--kv-cache-dtype fp8_e4m3`. An fp8 KV cache holds
twice the tokens, and its attention is priced from the database's fp8-KV tables.

A points file's own `scheduler_recv_interval` and `kv_cache_dtype` columns win over this table.
"""

from __future__ import annotations

from testbed.validate.points import MeasuredPoint

FP8_KV_RECIPES = (
    ("vllm", "meta-llama/Llama-3.1-70B", ("h100_sxm", "h200_sxm", "b200_sxm")),
    ("sglang", "deepseek-ai/DeepSeek-R1", ("b200_sxm", "b300_sxm")),
    ("sglang", "deepseek-ai/DeepSeek-V3", ("b200_sxm", "b300_sxm")),
)  # (backend, model, GPUs) whose InferenceMAX recipes keep the KV cache in fp8

RECV_INTERVAL_GPUS = ("b200_sxm", "b300_sxm")
RECV_INTERVAL_MODELS = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3")
RECV_INTERVAL_MANY_CLIENTS = 16  # `if [[ $CONC -ge 16 ]]`
RECV_INTERVAL_FEW, RECV_INTERVAL_MANY = 10, 30


def scheduler_recv_interval(p: MeasuredPoint, harness: str) -> int:
    """SGLang's --scheduler-recv-interval that p's server ran with (1: every step)."""
    if p.scheduler_recv_interval is not None:
        return p.scheduler_recv_interval
    if harness != "inferencemax" or p.backend != "sglang" or p.system not in RECV_INTERVAL_GPUS or p.model_path not in RECV_INTERVAL_MODELS:
        return 1
    if p.tp == 4 and p.precision == "fp8":
        return RECV_INTERVAL_FEW
    return RECV_INTERVAL_MANY if (p.concurrency or 1) >= RECV_INTERVAL_MANY_CLIENTS else RECV_INTERVAL_FEW


def kv_cache_dtype(p: MeasuredPoint, harness: str) -> str:
    """The KV cache's dtype that p's server ran with, as --kv-cache-dtype says it (auto: the model's)."""
    if p.kv_cache_dtype is not None:
        return p.kv_cache_dtype
    if harness == "inferencemax" and any(
        p.backend == backend and p.model_path == model and p.system in gpus for backend, model, gpus in FP8_KV_RECIPES
    ):
        return "fp8"
    return "auto"
