"""Measured serving points: the file `testbed validate` checks the simulator against.

The default is `systems/silicon_sample.csv` of aiconfigurator-core: one row per measured
operating point of a serving engine (vLLM, SGLang, TRT-LLM) on a GPU system, with the model,
precision, input and output length, client concurrency, parallelism and the measured mean TTFT
and TPOT. Any CSV with the same columns is taken (`--points FILE`). A row the simulator cannot
express is kept, with the reason it is skipped: nothing is dropped silently.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

from scheduler.model_config import ModelConfig, bundled_model_names, bundled_model_of, checkpoint_weight_format, load_model_config
from simulator.costs.precision import KV_CACHE_DTYPES, MXFP4
from testbed.errors import ConfigError, TraceError

# Columns a points file must have, and what each means.
REQUIRED = {
    "backend": "the serving engine (vllm, sglang, trtllm)",
    "model_path": "the model's Hugging Face id",
    "system": "the GPU system, as AIConfigurator names it (h100_sxm, h200_sxm, b200_sxm, ...)",
    "precision": "the weights' precision (bf16, fp8, fp4, ...)",
    "isl": "input tokens of every request",
    "osl": "output tokens of every request",
    "batch_size": "client concurrency of an aggregated point, per attention data-parallel rank (the clients: batch_size x attention_dp_size)",
    "tp_size": "tensor parallelism",
    "silicon_ttft_ms": "measured mean TTFT",
    "silicon_tpot_ms": "measured mean TPOT",
}
# Columns read where present.
OPTIONAL = (
    "id",
    "backend_version",
    "mode",
    "gemm_quant_mode",
    "moe_quant_mode",
    "pp_size",
    "attention_dp_size",
    "moe_ep_size",
    "moe_tp_size",
    "silicon_data_source",
    "harness",  # the benchmark client that measured the point (harness.py); else inferred from the others
    "scheduler_recv_interval",  # SGLang's --scheduler-recv-interval of the server (default 1)
    "kv_cache_dtype",  # the server's --kv-cache-dtype (auto, bf16, fp8; default: recipes.py, else auto)
)
BACKENDS_WITH_A_SCHEDULER = ("vllm", "sglang")
HARNESSES = ("inferencemax", "fixed")  # the benchmark clients a harness column may name (harness.py)
# Weight formats the simulator prices (the database's GEMM tables of that format), by the row's
# precision and GEMM format. A row that states neither (366 of silicon_sample.csv's, all of original
# checkpoints such as Qwen/Qwen3-32B) is served as the checkpoint is: its own dtype, as vLLM and SGLang
# do without --quantization. It is priced so and shown as "unstated", not mixed with the rows that say
# bf16. fp8 without a GEMM format is per tensor (the engines' --quantization fp8).
UNSTATED = "unstated"
PRECISIONS = {"bf16": None, "fp16": None, UNSTATED: None, "fp8": "fp8", "fp4": "nvfp4"}
FP8_FORMATS = ("fp8", "fp8_block")
GEMM_FORMATS = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4", "bfloat16": None, "float16": None, "bf16": None, "fp16": None}
# The fp8 checkpoint that rows of an fp8 precision served where they name the base model (a bf16 one):
# Zhipu publishes GLM-5's fp8 weights as zai-org/GLM-5-FP8 (128x128 blocks; aiconfigurator-core ships
# its config), the checkpoint SGLang's GLM-5 fp8 serving loads, as its rows' fp8_block experts say.
_FP8_CHECKPOINTS = {"zhipuai/GLM-5": "zai-org/GLM-5-FP8"}


@dataclass(frozen=True)
class MeasuredPoint:
    """One row of a points file: what was served, and what was measured."""

    line: int  # in the file (the header is line 1)
    id: str
    backend: str
    backend_version: str | None
    model_path: str
    system: str
    precision: str
    mode: str  # agg (one engine does prefill and decode) or disagg
    isl: int
    osl: int
    concurrency: int | None
    tp: int | None  # a disaggregated point gives its workers' TP in other columns
    pp: int
    attention_dp: int
    moe_ep: int
    moe_tp: int | None  # the routed experts' TP (a mixture of experts; None where not given)
    gemm_quant: str | None
    moe_quant: str | None
    # The server's settings where the file states them (None: recipes.py's, else the engine's default)
    scheduler_recv_interval: int | None  # SGLang's --scheduler-recv-interval
    kv_cache_dtype: str | None  # --kv-cache-dtype
    measured_on: str | None  # the day it was measured (YYYY-MM-DD, the source's measured=): its recipe's version
    ttft_ms: float
    tpot_ms: float
    row: dict  # every column as read, for the output CSV

    @property
    def load(self) -> tuple:
        """What the point served, without where it sits in the file or what was measured: two points
        of one load simulate alike (the file repeats some loads, measured again)."""
        return (
            self.backend,
            self.backend_version,
            self.model_path,
            self.system,
            self.precision,
            self.mode,
            self.isl,
            self.osl,
            self.concurrency,
            self.tp,
            self.pp,
            self.attention_dp,
            self.moe_ep,
            self.moe_tp,
            self.gemm_quant,
            self.moe_quant,
            self.scheduler_recv_interval,
            self.kv_cache_dtype,
        )

    @property
    def model(self) -> str | None:
        """The bundled config of this point's model, if one ships."""
        return bundled_model_of(self.model_path)

    @property
    def config(self) -> ModelConfig | None:
        """The bundled config of this point's model (read once a process), if one ships."""
        return None if self.model is None else _config(self.model)

    @property
    def quantization(self) -> str | None:
        """--quantization for this point: the row's GEMM format where it gives one, else its precision's;
        but an fp8 checkpoint runs the kernels of its own fp8 format, whatever the row calls it (vLLM's
        rows of Qwen3-235B-A22B-FP8, 128x128 blocks, say fp8; SGLang's of the same checkpoint fp8_block),
        and an MXFP4 checkpoint is served as it is stored (None: its own format), whatever the row calls
        it (openai/gpt-oss-120b's rows say nvfp4 GEMMs and experts; the engines load its MXFP4 experts
        beside bf16 attention, and have no other way to load it)."""
        if self.gemm_quant in GEMM_FORMATS and self.precision not in (UNSTATED, "bf16", "fp16"):
            label = GEMM_FORMATS[self.gemm_quant]
        else:
            label = PRECISIONS.get(self.precision)
        stored = checkpoint_format(self.model_path)
        if stored == MXFP4:
            return None
        return stored if label in FP8_FORMATS and stored in FP8_FORMATS else label

    @property
    def group(self) -> tuple[str, str, str, str]:
        """(system, backend, model, precision): the precision as the weight format that prices it
        (fp8, fp8_block, nvfp4; mxfp4: a checkpoint served in its own), else as the row says (bf16, unstated)."""
        served = MXFP4 if checkpoint_format(self.model_path) == MXFP4 else None
        return (self.system, self.backend, self.model_path, self.quantization or served or self.precision)

    @property
    def dp(self) -> int:
        """Attention data-parallel ranks, as the row's columns give them: attention_dp_size, else what
        its experts' GPUs imply (AIConfigurator's rows keep tp x attention_dp = moe_tp x moe_ep; its
        gap-analysis rows of vLLM's Qwen3-235B leave attention_dp_size empty beside moe_tp 2 at tp 1:
        vLLM's -dp 2, the experts split over both ranks' GPUs)."""
        if self.attention_dp > 1:
            return self.attention_dp
        gpus = (self.moe_tp or 1) * self.moe_ep
        return gpus // self.tp if self.tp and gpus > self.tp and gpus % self.tp == 0 else 1

    def skip_reason(self) -> str | None:
        """Why the simulator cannot express this point, as "what: detail"; None if it can."""
        if self.mode != "agg":
            return f"{self.mode}: prefill and decode on separate workers (disaggregated serving)"
        if self.concurrency is None:
            return "no client concurrency: batch_size is empty"
        if self.tp is None:
            return "no tensor parallelism: tp_size is empty"
        if self.backend not in BACKENDS_WITH_A_SCHEDULER:
            return f"backend {self.backend}: no scheduler for it (have {', '.join(BACKENDS_WITH_A_SCHEDULER)})"
        if self.precision not in PRECISIONS:
            return f"precision {self.precision}: not priced ({self.gemm_quant or '?'} GEMMs; have {', '.join(PRECISIONS)})"
        if self.gemm_quant and self.gemm_quant not in GEMM_FORMATS:
            return f"GEMM format {self.gemm_quant}: not priced (have {', '.join(GEMM_FORMATS)})"
        if (self.scheduler_recv_interval or 1) > 1 and self.backend != "sglang":
            return f"scheduler_recv_interval {self.scheduler_recv_interval}: SGLang's setting, not {self.backend}'s"
        if self.pp > 1:
            return f"pipeline parallelism: {self.pp} stages"
        if self.model is None:
            return f"no model config: {self.model_path} (bundled: {', '.join(bundled_model_names())})"
        config = self.config
        if self.dp > 1 and not config.is_moe:
            return f"attention data parallelism: {self.dp} ranks of a dense model (a dense model's data parallelism is replicas)"
        gpus = self.tp * self.dp
        if config.is_moe and (self.moe_ep > 1 or self.moe_tp) and (self.moe_tp or 1) * self.moe_ep != gpus:
            return (
                f"mixture of experts: {self.moe_ep} expert ranks of {self.moe_tp or 1} GPUs beside attention over "
                f"{self.tp} x {self.dp} GPUs (priced: the experts over the attention's GPUs)"
            )
        # An fp8 checkpoint runs its own format in GEMMs and experts alike, whatever the row's labels say
        # (DeepSeek-R1's rows: fp8 GEMMs beside fp8_block experts, of one 128x128-block checkpoint).
        one_fp8_checkpoint = {self.moe_quant, self.gemm_quant} <= set(FP8_FORMATS) and checkpoint_format(self.model_path) in FP8_FORMATS
        if config.is_moe and self.moe_quant and self.gemm_quant and self.moe_quant != self.gemm_quant and not one_fp8_checkpoint:
            return f"mixture of experts: {self.moe_quant} experts beside {self.gemm_quant} GEMMs (priced: one format)"
        return None


@functools.cache
def _config(model: str) -> ModelConfig:
    return load_model_config(model)


@functools.cache
def checkpoint_format(model_path: str) -> str | None:
    """The fp8 or MXFP4 format the checkpoint `model_path` is stored in, from its config.json as aiconfigurator-core
    ships it (model_configs/<org>--<name>_config.json, the configs of its points' models; a base model's
    fp8 checkpoint where _FP8_CHECKPOINTS names one); None where no config ships or it is stored in neither
    (ModelOpt's per-tensor fp8 states its format elsewhere)."""
    import importlib.util
    import json

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    checkpoint = _FP8_CHECKPOINTS.get(model_path, model_path)
    path = Path(next(iter(spec.submodule_search_locations))) / "model_configs" / f"{checkpoint.replace('/', '--')}_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    fmt = checkpoint_weight_format(cfg)
    return fmt if fmt in (*FP8_FORMATS, MXFP4) else None


def default_points_path() -> Path:
    """silicon_sample.csv of the installed aiconfigurator-core (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "testbed validate: aiconfigurator-core is not installed (pip install -e '.[aiconfigurator]'), and no --points FILE was given"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "systems" / "silicon_sample.csv"
    if not path.is_file():
        raise ConfigError(f"testbed validate: {path} is missing from the installed aiconfigurator-core; give --points FILE")
    return path


def _int(path: str, line: int, row: dict, col: str, default: int | None = None, minimum: int = 0) -> int:
    text = (row.get(col) or "").strip()
    if not text:
        if default is None:
            raise TraceError(path, line, col, "empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, col, f"must be a number, got {text[:40]!r}") from None
    if not math.isfinite(value) or value != int(value) or value < minimum:
        raise TraceError(path, line, col, f"must be an integer >= {minimum}, got {text[:40]!r}")
    return int(value)


def _ms(path: str, line: int, row: dict, col: str) -> float:
    text = (row.get(col) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(path, line, col, f"must be a number of milliseconds, got {text[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise TraceError(path, line, col, f"must be positive, got {text[:40]!r}")
    return value


def _concurrency(path: str, line: int, row: dict) -> int | None:
    """The client concurrency: batch_size x attention_dp_size, else the source's silicon_concurrency=N (a disaggregated
    point leaves batch_size empty); None if neither says."""
    if row.get("batch_size"):  # AIConfigurator's batch_size is one attention DP rank's
        return _int(path, line, row, "batch_size", minimum=1) * (_int(path, line, row, "attention_dp_size", default=1) or 1)
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source") or "")
    return int(found.group(1)) if found and int(found.group(1)) > 0 else None


def _measured_on(row: dict) -> str | None:
    """The day the point was measured, from its source's `measured=2026-04-03T17:02:12Z`; None if unsaid."""
    found = re.search(r"measured=(\d{4}-\d\d-\d\d)", row.get("silicon_data_source") or "")
    return found.group(1) if found else None


def load_points(path: str | Path) -> list[MeasuredPoint]:
    """Every row of a points file; TraceError (file, line, column) for one that cannot be read."""
    path = str(path)
    try:
        f = open(path, newline="", encoding="utf-8")
    except IsADirectoryError:
        raise TraceError(path, None, None, "is a folder, not a points CSV") from None
    with f:
        try:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                need = "; ".join(f"{c} ({REQUIRED[c]})" for c in missing)
                raise TraceError(path, 1, missing[0], f"missing column{'s' if len(missing) > 1 else ''}: {need}")
            points = []
            for line, row in enumerate(reader, start=2):
                points.append(_point(path, line, row))
        except UnicodeDecodeError:
            raise TraceError(path, None, None, "not a text CSV file") from None
        except csv.Error as e:
            raise TraceError(path, reader.line_num, None, f"bad CSV: {e}") from None
    if not points:
        raise TraceError(path, None, None, "no points (a header and no rows)")
    return points


def _point(path: str, line: int, row: dict) -> MeasuredPoint:
    text = {k: (v or "").strip() for k, v in row.items() if k is not None}
    for col in ("backend", "model_path", "system"):
        if not text.get(col):
            raise TraceError(path, line, col, "empty")
    if text.get("kv_cache_dtype") and text["kv_cache_dtype"].lower() not in KV_CACHE_DTYPES:
        raise TraceError(path, line, "kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)}, got {text['kv_cache_dtype'][:40]!r}")
    if text.get("harness") and text["harness"].lower() not in HARNESSES:
        raise TraceError(path, line, "harness", f"must be one of {', '.join(HARNESSES)}, got {text['harness'][:40]!r}")
    return MeasuredPoint(
        line=line,
        id=text.get("id") or f"line {line}",
        backend=text["backend"].lower(),
        backend_version=text.get("backend_version") or None,
        model_path=text["model_path"],
        system=text["system"].lower(),
        precision=(text.get("precision") or (UNSTATED if not text.get("gemm_quant_mode") else text["gemm_quant_mode"])).lower(),
        mode=(text.get("mode") or "agg").lower(),
        isl=_int(path, line, text, "isl", minimum=1),
        osl=_int(path, line, text, "osl", minimum=1),
        concurrency=_concurrency(path, line, text),
        tp=_int(path, line, text, "tp_size", minimum=1) if text.get("tp_size") else None,
        pp=_int(path, line, text, "pp_size", default=1),
        attention_dp=_int(path, line, text, "attention_dp_size", default=1) or 1,  # some rows say 0: none
        moe_ep=_int(path, line, text, "moe_ep_size", default=1) or 1,  # dense rows may say 0: none
        moe_tp=_int(path, line, text, "moe_tp_size", minimum=0, default=0) or None,  # dense rows: 0 or empty
        gemm_quant=(text.get("gemm_quant_mode") or None),
        moe_quant=(text.get("moe_quant_mode") or None),
        scheduler_recv_interval=_int(path, line, text, "scheduler_recv_interval", minimum=1)
        if text.get("scheduler_recv_interval")
        else None,
        kv_cache_dtype=(text.get("kv_cache_dtype") or "").lower() or None,
        measured_on=_measured_on(text),
        ttft_ms=_ms(path, line, text, "silicon_ttft_ms"),
        tpot_ms=_ms(path, line, text, "silicon_tpot_ms"),
        row=text,
    )


def parse_filter(spec: str | None, points: list[MeasuredPoint]) -> dict[str, set[str]]:
    """`system=h200_sxm,backend=vllm` -> {column: values}; a column named twice takes either value.
    ConfigError for an unknown column, or a value no point of the file has (naming the known ones)."""
    if not spec:
        return {}
    columns = sorted({c for p in points for c in p.row})
    wanted: dict[str, set[str]] = {}
    for part in spec.split(","):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ConfigError(f"--filter {spec}: {part!r} is not COLUMN=VALUE")
        if key not in columns:
            raise ConfigError(f"--filter: unknown column {key!r}; the points file has: {', '.join(columns)}")
        known = sorted({p.row.get(key, "") for p in points})
        if value.lower() not in {k.lower() for k in known}:
            shown = ", ".join(known[:30]) + (f", ... ({len(known)} in all)" if len(known) > 30 else "")
            raise ConfigError(f"--filter: no point has {key}={value}; its values: {shown}")
        wanted.setdefault(key, set()).add(value.lower())
    return wanted


def select(points: list[MeasuredPoint], wanted: dict[str, set[str]]) -> list[MeasuredPoint]:
    return [p for p in points if all(p.row.get(k, "").lower() in vs for k, vs in wanted.items())]
