"""Runs of other serving systems, imported into run folders: one module per format.

    llmservingsim  a real vLLM run recorded by LLMServingSim (requests.jsonl + meta.json)
    vllm-bench     `vllm bench serve --save-result --save-detailed` JSON
    sglang-bench   `python -m sglang.bench_serving --output-file F --output-details` JSONL

detect_import_format reads the first JSON object of the file (never its name);
load_import parses it into an ImportedRun. Bad files raise TraceError naming the file,
the line and the field.
"""

from __future__ import annotations

import json
import os

from testbed.errors import TraceError
from testbed.runs.importers import llmservingsim, sglang_bench, vllm_bench
from testbed.runs.importers.imported import ImportedRun, json_lines

IMPORT_FORMATS = ("llmservingsim", "vllm-bench", "sglang-bench")


def detect_import_format(path: str | os.PathLike) -> str:
    path = str(path)
    try:
        lineno, obj = next(json_lines(path))
    except StopIteration:
        raise TraceError(path, None, None, "empty file") from None
    except TraceError:
        # One JSON document over several lines (an indented result file).
        try:
            with open(path, encoding="utf-8-sig") as f:
                obj = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise TraceError(path, 1, None, "not JSON or JSONL: not a run of llmservingsim, vllm-bench or sglang-bench") from None
        lineno = 1
    for fmt, module in (("llmservingsim", llmservingsim), ("vllm-bench", vllm_bench), ("sglang-bench", sglang_bench)):
        if module.looks_like(obj):
            return fmt
    keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
    raise TraceError(path, lineno, None, f"unrecognized run format (keys {keys}); expected {', '.join(IMPORT_FORMATS)}; use --format")


def load_import(path: str | os.PathLike, format: str | None = None, *, entry: int | None = None, seed: int = 0) -> ImportedRun:
    path = str(path)
    if not os.path.isfile(path):
        raise TraceError(path, None, None, "no such file")
    fmt = format or detect_import_format(path)
    if fmt == "llmservingsim":
        return llmservingsim.load(path)
    if fmt == "vllm-bench":
        return vllm_bench.load(path, entry)
    if fmt == "sglang-bench":
        return sglang_bench.load(path, entry, seed)
    raise TraceError(path, None, None, f"unknown format {fmt!r}; choose one of {', '.join(IMPORT_FORMATS)}")


__all__ = ["IMPORT_FORMATS", "ImportedRun", "detect_import_format", "load_import"]
