"""A run folder: what one replay leaves behind, in the same schema for sim and real.

    run.json          config, versions, trace path and hash, status, summary
    requests.parquet  one row per request (testbed.runs.metrics.requests_frame)
    steps.parquet     one row per forward step (scheduler.step_log.STEP_COLUMNS)
    wall.json         when it ran and how long it took on the wall clock

run.json, requests.parquet and steps.parquet depend only on the trace, the
options and the seed (a simulated run is reproducible file for file); wall.json
holds what differs between two runs of the same thing.

While the run goes (testbed.runs.writer): run.json says "running", and its steps and
finished requests reach two journals (testbed.runs.journal) every second or so:

    steps.journal.arrows     the steps so far
    requests.journal.arrows  the requests finished (or rejected) so far

The writer holds a lock on the steps journal. At the end the parquet files are written
(steps.parquet's earlier parts as the run goes, to steps.parquet.tmp) and the journals
removed; Ctrl-C or SIGTERM ends the same way with status "incomplete".
A folder whose writer died without finishing (SIGKILL, a crash, the machine) still says
"running" but nobody holds the lock: load_run reads it from the journals, as
"incomplete", with every row up to the last flush.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from scheduler.loop.step_log import FLOAT_COLUMNS, STEP_COLUMNS
from testbed.runs.journal import is_locked, read_journal, record_batch
from testbed.runs.metrics import REQUESTS_SCHEMA, requests_schema, run_summary

RUN_FILE = "run.json"
REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
WALL_FILE = "wall.json"
REQUESTS_JOURNAL = "requests.journal.arrows"
STEPS_JOURNAL = "steps.journal.arrows"
JOURNALS = {REQUESTS_FILE: REQUESTS_JOURNAL, STEPS_FILE: STEPS_JOURNAL}
# What a killed run says about itself (run.json still says "running").
DIED_ERROR = "the process ended without finishing the run (killed?): the tables hold what it wrote until then"

# The steps journal's columns (steps.parquet has the same names and types).
STEP_SCHEMA = pa.schema(
    [
        (
            name,
            pa.string() if name == "mode" else pa.float64() if name.endswith(("_start", "_end")) or name in FLOAT_COLUMNS else pa.int64(),
        )
        for name in STEP_COLUMNS
    ]
    + [("instance", pa.int64())]  # which instance of a cluster took the step (0 for one instance)
)


def _file_schema(schema: pa.Schema) -> pa.Schema:
    """A journal's schema as its parquet file holds it: text as pandas writes it, large_string."""
    return pa.schema([pa.field(f.name, pa.large_string() if f.type == pa.string() else f.type) for f in schema])


STEPS_FILE_SCHEMA = _file_schema(STEP_SCHEMA)  # steps.parquet's (steps_file.py writes it a part at a time)
_REQUESTS_FILE_SCHEMA = _file_schema(REQUESTS_SCHEMA)
ROLE_FIELD = pa.field("role", pa.string())  # a PD run's steps: prefill or decode, the instance's role


def steps_schema(cols: Mapping[str, Any]) -> pa.Schema:
    """STEP_SCHEMA, and a PD run's role column where the steps have one."""
    return pa.schema(list(STEP_SCHEMA) + [ROLE_FIELD]) if "role" in cols else STEP_SCHEMA


def unused_path(path: Path) -> Path:
    """path, or else the first of path-2, path-3, ... that does not exist: default folders are
    named to the second, and two quick commands (a replay, a study) would share one."""
    if not path.exists():
        return path
    n = 2
    while path.with_name(f"{path.name}-{n}").exists():
        n += 1
    return path.with_name(f"{path.name}-{n}")


def holds_only_profiles(folder: Path) -> bool:
    """A folder of cost profiles and nothing else (testbed calibrate writes them under runs/profiles/
    by default): not a run that lost its run.json."""
    from simulator.costs.profile_cost import PROFILE_FORMAT

    files = [p for p in folder.iterdir() if not p.name.startswith(".")]
    if not files or any(not (p.is_file() and p.suffix == ".json") for p in files):
        return False
    for p in files:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                head = f.read(200)  # a profile's JSON opens with its "format"
        except OSError:
            return False
        if f'"{PROFILE_FORMAT}"' not in head:
            return False
    return True


def check_out_folder(out: str | os.PathLike) -> Path:
    """--out as a run folder to write, or ConfigError in one line: empty, a file, or under a file."""
    from testbed.errors import ConfigError

    if not str(out).strip():
        raise ConfigError("--out '': give a folder for the run")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a folder")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--out {out}: {parent} is a file, so no folder can be made under it")
            break
    return path


def temporary_path(path: Path) -> Path:
    """Where a file of the folder is written before it is renamed to path (whole)."""
    return path.with_name(path.name + ".tmp")


def _write_atomic(path: Path, write) -> None:
    tmp = temporary_path(path)
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    _write_atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n"))


def write_requests(path: Path, requests: Mapping[str, Any]) -> None:
    """requests.parquet from metrics.requests_table (or requests_frame), through Arrow with the
    journal's column conversions (pandas' to_parquet converted token_times, a column of arrays,
    an element at a time: three times as slow); it reads back as requests_frame. Dictionary encoding for text
    columns only: on the float columns (timestamps, all distinct) it took three quarters of
    the write and made the file larger."""
    schema = requests_schema(requests)
    file_schema = _REQUESTS_FILE_SCHEMA if schema is REQUESTS_SCHEMA else _file_schema(schema)
    table = pa.Table.from_batches([record_batch(requests, schema)])
    table = table.cast(file_schema)
    text = [f.name for f in file_schema if f.type == pa.large_string()]
    _write_atomic(path, lambda p: pq.write_table(table, p, use_dictionary=text))


STEPS_DICTIONARY_COLUMNS = ["mode"]  # steps.parquet's dictionary-encoded columns (both of its writers)


def steps_table(cols: dict) -> pa.Table:
    """StepLog.columns(...) as a table of steps.parquet's schema, straight from its typed
    columns (no DataFrame on the way: a long run has 100k+ rows)."""
    schema = steps_schema(cols)
    file_schema = STEPS_FILE_SCHEMA if schema is STEP_SCHEMA else _file_schema(schema)
    return pa.Table.from_batches([record_batch(cols, schema)]).cast(file_schema)  # (text as pandas writes it: large_string)


def write_steps(path: Path, cols: dict) -> None:
    """steps.parquet from StepLog.columns(...) at once; it reads back as write_requests's tables do."""
    table = steps_table(cols)
    dictionary = STEPS_DICTIONARY_COLUMNS + (["role"] if "role" in cols else [])
    _write_atomic(path, lambda p: pq.write_table(table, p, use_dictionary=dictionary))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("testbed", "simpy", "pandas", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


@dataclass
class Run:
    path: Path
    meta: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    wall: dict

    @property
    def summary(self) -> dict:
        return self.meta.get("summary") or {}

    @property
    def status(self) -> str:
        return self.meta.get("status", "unknown")


class RunLoadError(Exception):
    pass


def read_run_meta(path: Path) -> dict:
    """run.json of a run folder; RunLoadError saying why it cannot be used."""
    run_file = path / RUN_FILE
    if not run_file.is_file():
        raise RunLoadError(f"{path}: not a run folder (no {RUN_FILE})")
    try:
        meta = json.loads(run_file.read_text())
    except json.JSONDecodeError as e:
        raise RunLoadError(f"{run_file}: bad JSON at line {e.lineno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RunLoadError(f"{run_file}: {e}") from None
    if not isinstance(meta, dict):
        raise RunLoadError(f"{run_file}: not a JSON object")
    summary = meta.get("summary")
    if summary is not None and not isinstance(summary, dict):
        raise RunLoadError(f"{run_file}: summary is not a JSON object")
    return meta


def writer_alive(path: Path) -> bool:
    """A replay is writing this folder now (it holds the steps journal's lock)."""
    return is_locked(Path(path) / STEPS_JOURNAL)


def effective_status(path: Path, meta: dict) -> str:
    """run.json's status, but "incomplete" for a run that says "running" and has no writer left."""
    status = str(meta.get("status", "unknown"))
    return "incomplete" if status == "running" and not writer_alive(path) else status


def interrupted_message(path: Path, since: float) -> str:
    """The one line a command stopped by Ctrl-C or SIGTERM prints about the run folder it was
    writing: what is there now. `since`: when the command started (an older run.json in the
    folder is not this run's)."""
    try:
        if (Path(path) / RUN_FILE).stat().st_mtime < since - 1.0:  # file times are a coarser clock
            raise FileNotFoundError
        status = effective_status(Path(path), read_run_meta(Path(path)))
    except (OSError, RunLoadError):
        return f"interrupted before the run started: nothing was written to {path}"
    if status == "complete":
        return f"interrupted after the run finished: {path} is complete"
    # "running": this process is the writer, and it is leaving without finishing.
    return f"interrupted: {path} is marked {'incomplete' if status == 'running' else status}; it loads with what it has"


def folder_stamp(path: str | os.PathLike) -> tuple:
    """Changes whenever what load_run returns may change: run.json and the journals' sizes and
    times, and whether a writer holds the folder (a cache key of a run)."""
    path = Path(path)
    stamp: list = [(path / RUN_FILE).stat().st_mtime_ns]
    for name in (REQUESTS_JOURNAL, STEPS_JOURNAL):
        try:
            st = (path / name).stat()
            stamp.append((st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            stamp.append(None)
    return (*stamp, writer_alive(path))


def _read_table(path: Path, name: str) -> pd.DataFrame:
    """A table of the folder: its parquet file, else its journal (a run still going, or killed)."""
    f = path / name
    if f.is_file():
        return pd.read_parquet(f)
    journal = path / JOURNALS[name]
    if not journal.is_file():
        return pd.DataFrame()
    table = read_journal(journal, REQUESTS_SCHEMA if name == REQUESTS_FILE else STEP_SCHEMA).to_pandas()
    # Requests reach the journal in the order they finish; the table is in trace order.
    return table.sort_values("index", ignore_index=True) if name == REQUESTS_FILE else table


def load_requests(path: str | os.PathLike, columns: list[str]) -> pd.DataFrame:
    """These columns of a finished run's requests table, and nothing else of the folder (a caller
    that replays hundreds of runs: testbed validate)."""
    return pd.read_parquet(Path(path) / REQUESTS_FILE, columns=columns)


def load_run(path: str | os.PathLike) -> Run:
    """Load a run folder; an incomplete run loads with whatever tables it has, a run still going
    or killed from its journals (with a summary of what they hold)."""
    path = Path(path)
    meta = read_run_meta(path)
    requests, steps = _read_table(path, REQUESTS_FILE), _read_table(path, STEPS_FILE)
    status = effective_status(path, meta)
    if status != meta.get("status"):
        meta = meta | {"status": status, "error": meta.get("error") or DIED_ERROR}
    if meta.get("summary") is None and "status" in requests.columns:
        simulated_s = float(steps["process_end"].max()) if len(steps) else 0.0
        kv_tokens = (meta.get("scheduler") or {}).get("kv_tokens")
        meta = meta | {"summary": run_summary(requests, len(steps), simulated_s, kv_tokens)}
    wall_file = path / WALL_FILE
    wall = json.loads(wall_file.read_text()) if wall_file.is_file() else {}
    return Run(path, meta, requests, steps, wall)
