"""ProfileCostModel: forward and CPU-stage times from a calibrated profile (testbed calibrate).

A profile is a JSON file: what was measured on the real engine (raw
measurements) and the models fitted to them (simulator/profiles/profile_fit.py). It plugs
in beside the roofline through the same CostModel protocol.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from simulator.costs.cost_model import CpuStageCosts, StageCost
from simulator.profiles.profile_fit import DECODE_FEATURES, EXTEND_FEATURES, LinearFit, extend_features

PROFILE_FORMAT = "testbed-profile"
PROFILE_VERSION = 2  # 2: extend knee on attention pairs, forwards timed in a replay in the fit


class ProfileError(ValueError):
    pass


def check_header(profile: dict, path: str | None) -> None:
    """A testbed profile of the version this testbed reads (either source: engine or kernels)."""
    if profile.get("format") != PROFILE_FORMAT:
        raise ProfileError(f'{path or "profile"}: not a testbed profile (no "format": "{PROFILE_FORMAT}")')
    if profile.get("version") != PROFILE_VERSION:
        raise ProfileError(
            f"{path or 'profile'}: profile version {profile.get('version')}, this testbed reads version "
            f"{PROFILE_VERSION}: make it again with testbed calibrate"
        )


def read_profile(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}:{e.lineno}: bad JSON: {e.msg}") from None


class ProfileCostModel:
    """Forward and CPU-stage times of a profile; with overlap, as the profile's overlapped replay measured them."""

    hardware_spec = None  # the KV pool is the one the engine had (engine_kv_tokens)

    def __init__(self, profile: dict, path: str | None = None, overlap: bool = False) -> None:
        check_header(profile, path)
        try:
            fitted = profile["fit"]
            self.extend = LinearFit.from_dict(EXTEND_FEATURES, fitted["extend"])
            self.knee = float(fitted["extend"].get("knee", 0.0))
            self.decode = LinearFit.from_dict(DECODE_FEATURES, fitted["decode"])
            # With overlap the CPU stages run beside a forward: on a CPU they compete for the cores.
            cpu = fitted.get("cpu_overlap", fitted["cpu"]) if overlap else fitted["cpu"]
            self.cpu = CpuStageCosts(**{stage: StageCost(**cpu[stage]) for stage in ("schedule", "launch", "process")})
            # With overlap a forward takes fixed_s + per_req_s x batch size longer (calibrate's overlapped replay).
            ov = fitted.get("overlap_forward", {}) if overlap else {}
            self.extend_fixed, self.extend_per_req = (float(ov.get("extend", {}).get(k, 0.0)) for k in ("fixed_s", "per_req_s"))
            decode_fixed, decode_per_req = (float(ov.get("decode", {}).get(k, 0.0)) for k in ("fixed_s", "per_req_s"))
        except (KeyError, TypeError) as e:
            raise ProfileError(f"{path or 'profile'}: missing or malformed fit ({e})") from None
        self.profile = profile
        self.path = path or "profile"
        self.model = profile.get("model")
        self.engine_kv_tokens = profile.get("engine", {}).get("kv_tokens")
        self.name = f"profile:{Path(path).name if path else profile.get('name', 'inline')}"
        self._d_fixed, self._d_req, self._d_kv, self._d_pad = self.decode.coef
        self._d_fixed += decode_fixed
        self._d_req += decode_per_req

    @classmethod
    def load(cls, path: str | Path, overlap: bool = False) -> "ProfileCostModel":
        return cls(read_profile(path), str(path), overlap)

    def check_model(self, model, tp: int, ep: int = 1, dp: int = 1) -> None:
        """The engine ran one model on one device."""
        if model.name != self.model or (tp, ep, dp) != (1, 1, 1):
            asked = f"TP {tp}" + (f", EP {ep}" if ep > 1 else "") + (f", DP {dp}" if dp > 1 else "")
            raise ProfileError(f"--profile {self.path} was calibrated for {self.model} at TP 1, not {model.name} at {asked}")

    def check_expert_load(self, imbalance: float | None) -> None:
        """The engine's experts took whatever load its routing gave them."""
        if imbalance is not None:
            raise ProfileError(
                f"--profile {self.path} was calibrated on this project's engine, whose experts take the load its routing "
                f"gives: --expert-imbalance {imbalance:g} is for the roofline and kernel profiles"
            )

    def check_precision(self, asked) -> None:
        """This project's engine runs the model's own dtype: fp8 weights or KV (simulator/costs/precision.py) are not in its timings."""
        if asked.quantized_weights or asked.fp8_kv:
            raise ProfileError(
                f"--profile {self.path} was calibrated on this project's engine, which runs the model's own "
                f"dtype, not {asked.describe()}; quantized weights or an fp8 KV cache take a kernel profile "
                f"(testbed calibrate --source aiconfigurator --quantization ... / --kv-cache-dtype fp8) or the roofline"
            )

    def forward_time(self, plan: ForwardPlan) -> float:
        bs = len(plan.req_pool_indices)
        if bs == 0:
            return 0.0
        if plan.mode is ForwardMode.DECODE:
            return self._decode_time(bs, plan.sum_seq_len, plan.max_seq_len)
        if plan.mode is ForwardMode.MIXED:
            return self._mixed_time(plan)
        return self._extend_time(plan.prefix_lens, plan.extend_lens)

    def _decode_time(self, bs: int, sum_seq_len: int, max_seq_len: int) -> float:
        return self._d_fixed + self._d_req * bs + self._d_kv * sum_seq_len + self._d_pad * bs * max_seq_len

    def _extend_time(self, prefix_lens: list[int], extend_lens: list[int]) -> float:
        # Extend batches are few and small: the per-request features are worth a loop.
        t = self.extend.predict(extend_features(prefix_lens, extend_lens, self.knee))
        return t + self.extend_fixed + self.extend_per_req * len(extend_lens)

    def _mixed_time(self, plan: ForwardPlan) -> float:
        """A prefill with decodes riding along (--enable-mixed-chunk): the prefill rows as an
        extend, the one-token rows as a decode step without its fixed part (the weights are
        read once for both). The extend fit is not asked about many one-token rows on long
        contexts, which the calibration never measured."""
        ext_p, ext_e, dec_seq = [], [], []
        for p, e in zip(plan.prefix_lens, plan.extend_lens):
            if e == 1 and p > 0:
                dec_seq.append(p + 1)
            else:
                ext_p.append(p)
                ext_e.append(e)
        if not ext_e:
            return self._decode_time(len(dec_seq), sum(dec_seq), max(dec_seq))
        t = self._extend_time(ext_p, ext_e)
        if dec_seq:
            t += self._decode_time(len(dec_seq), sum(dec_seq), max(dec_seq)) - self._d_fixed
        return t

    def cpu_time(self, stage: str, num_reqs: int, num_tokens: int) -> float:
        return self.cpu.time(stage, num_reqs, num_tokens)


def engine_defaults(path: str | Path) -> dict:
    """What a replay with this profile defaults to, from the engine it measured: "hardware" (the
    spec it was calibrated on) and "overlap" (the real engine's default there: off on a CPU),
    and "memory_bytes" and "sm_version" (its device's memory and compute capability, from a kernel profile), each where the profile says; {} for a file that is not a readable profile (loading it says why)."""
    try:
        return _engine_defaults(str(path), Path(path).stat().st_mtime_ns)
    except OSError:
        return {}


@functools.lru_cache(maxsize=16)
def _engine_defaults(path: str, mtime_ns: int) -> dict:
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(profile, dict):
        return {}
    engine = profile.get("engine") if isinstance(profile.get("engine"), dict) else {}
    spec = profile.get("hardware_spec") if isinstance(profile.get("hardware_spec"), dict) else {}
    out = {
        "hardware": profile.get("hardware"),
        "overlap": engine.get("overlap"),
        "memory_bytes": spec.get("memory_bytes"),
        "sm_version": spec.get("sm_version"),
    }
    return {k: v for k, v in out.items() if v is not None}
