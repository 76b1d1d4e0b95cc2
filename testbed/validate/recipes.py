"""Server settings that measured points ran with, where they differ from the engine's defaults
and the replay can take them.

InferenceMAX publishes each sweep's server command (SemiAnalysisAI/InferenceX,
benchmarks/single_node/<model>_<precision>_<gpu>.sh; benchmarks/*_docker.sh before 2026-01).
Of what those recipes set, the replay takes SGLang's --scheduler-recv-interval: every SGLang
DeepSeek-R1 recipe on the B200 and B300, fp8 and fp4, from 2025-11 (the file's first such
points) to 2026-04 (its last), runs `--scheduler-recv-interval 30` at 16 clients or more and 10
below, except the fp8 recipe at TP 4 (10 at every concurrency). Its points in silicon_sample.csv
are labelled DeepSeek-R1 or DeepSeek-V3 (the db-dump's rows of the same dsr1 sweeps).

A points file's own `scheduler_recv_interval` column wins over this table.
"""

from __future__ import annotations

from testbed.validate.points import MeasuredPoint

RECV_INTERVAL_GPUS = ("b200_sxm", "b300_sxm")
RECV_INTERVAL_MODELS = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3")
RECV_INTERVAL_MANY_CLIENTS = 16  # `if [[ $CONC -ge 16 ]]`
RECV_INTERVAL_FEW, RECV_INTERVAL_MANY = 10, 30


def scheduler_recv_interval(p: MeasuredPoint, harness: str) -> int:
    """SGLang's --scheduler-recv-interval that p's server ran with (1: every step)."""
    if "scheduler_recv_interval" in p.row and p.row["scheduler_recv_interval"]:
        return p.scheduler_recv_interval
    if harness != "inferencemax" or p.backend != "sglang" or p.system not in RECV_INTERVAL_GPUS or p.model_path not in RECV_INTERVAL_MODELS:
        return 1
    if p.tp == 4 and p.precision == "fp8":
        return RECV_INTERVAL_FEW
    return RECV_INTERVAL_MANY if (p.concurrency or 1) >= RECV_INTERVAL_MANY_CLIENTS else RECV_INTERVAL_FEW
