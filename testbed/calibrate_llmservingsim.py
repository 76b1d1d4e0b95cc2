"""testbed calibrate --source llmservingsim: a kernel profile of a GPU from LLMServingSim's timings of it.

No engine runs: the profile lays out the per-module timings LLMServingSim's profiler measured on the
GPU under vLLM (a folder of its `meta.yaml` and `tp<N>/`: simulator/profiles/llmservingsim_profile.py),
for a GPU AIConfigurator has no kernels of or as a second source beside them, and is written where
--out says, in the profile format `--profile` reads.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.model_config import bundled_model_of
from simulator.profiles.interconnect_link import InterconnectLink
from simulator.profiles.llmservingsim_profile import TimingsFolderError, build_llmservingsim_profile, timings_meta
from testbed.calibrate_kernels import decode_at_batch_1_s, hbm_floor_s, profile_precision, write_profile
from testbed.errors import ConfigError


def default_out(timings: str | Path, tp: int) -> Path:
    """runs/profiles/<timings folder>-tp<N>.json (LLMServingSim's folders name the GPU and the model)."""
    return Path("runs") / "profiles" / f"{Path(timings).resolve().name}-tp{tp}.json"


def calibrate_llmservingsim(
    timings: str | Path, model: str | None, tp: int, out: str | Path, hardware: str | None = None, link: InterconnectLink | None = None
) -> dict:
    """Build the profile and write it; bad input raises ConfigError (one line, exit 2)."""
    folder = Path(timings)
    if not (folder / "meta.yaml").is_file():
        raise ConfigError(f"--timings {timings}: no meta.yaml there (a folder of LLMServingSim's timings: meta.yaml beside tp<N>/)")
    if model is None:
        timed = timings_meta(folder).get("model", "")
        model = bundled_model_of(timed)
        if model is None:
            raise ConfigError(f"--timings {timings}: its model {timed!r} has no bundled config; give --model")
    try:
        profile = build_llmservingsim_profile(folder, model, tp, hardware=hardware, link=link)
    except (TimingsFolderError, ValueError) as e:
        raise ConfigError(str(e)) from None
    write_profile(profile, out)
    return profile


def summary_lines(profile: dict, out: str | Path) -> list[str]:
    from scheduler.model_config import load_model_config

    db, spec = profile["database"], profile["hardware_spec"]
    model, tp = load_model_config(profile["model"]), profile["tp"]
    decode, floor = decode_at_batch_1_s(profile), hbm_floor_s(model, tp, spec["mem_bandwidth"], profile_precision(profile))
    lines = [
        f"profile {out}: {profile['model']} at TP {tp} on {profile['hardware']} ({db['gpu']}), "
        f"LLMServingSim's timings under vLLM {db['backend_version']} from {db['timings']}",
        f"  decode at batch 1, context 1024: {decode * 1e3:.2f} ms; weights / memory bandwidth (the floor): {floor * 1e3:.2f} ms ({decode / floor:.2f}x)",
    ]
    if profile.get("all_reduce"):
        lines.append(f"  all-reduces: {profile['all_reduce']}")
    return lines
