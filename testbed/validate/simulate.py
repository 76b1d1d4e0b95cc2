"""The simulator's answer for one measured point: the same load, replayed in sim.

A point is a closed-loop benchmark: `concurrency` clients, each sending a request of random
tokens (no shared prefixes, about `isl` of them) that generates about `osl` tokens, the next one
when its last has finished (`vllm bench serve` / `sglang.bench_serving --max-concurrency`). The
simulator runs the point's engine's scheduler (vLLM's or SGLang's, with their defaults but for
the settings recipes.py knows the point's server changed) at the point's TP and precision, with
every forward priced from AIConfigurator's kernels of that GPU system and backend (a kernel
profile, built once per system, backend, version, model, TP and precision).

The client. What the benchmark client sent decides the load as much as the server does: the
simulation sends what the point's harness sent (harness.py: InferenceMAX's 10 x concurrency
requests of lengths drawn from [0.8 L, L], or fixed lengths in synchronized waves) and averages
the requests it averaged. With fixed lengths, three waves are simulated: a warm-up, the measured
wave, and a trailing wave that keeps the load on while the measured wave runs (without it, the
measured wave's last decodes ran alone: on a prefill-heavy point, 4,096 tokens in and 128 out at
64 clients, TPOT came out 76 ms against 140 ms measured; with it, 129 ms). InferenceMAX's spread
of lengths is what puts its clients out of phase: its Llama-3.1-70B points on the H200 were
simulated 1.8x too slow in TTFT (median) as synchronized waves, 13% too fast with its requests.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from testbed.options import ReplayOptions
from testbed.validate.harness import harness_of, workload
from testbed.validate.kernel_bound import kernel_bound
from testbed.validate.points import MeasuredPoint
from testbed.validate.recipes import ParallelLayout, ServerRecipe, parallel_layout, server_recipe


class PointSkipped(Exception):
    """The point cannot be simulated here; str() says why (counted as skipped, not an error)."""


@dataclass(frozen=True)
class SimulatedPoint:
    ttft_ms: float
    tpot_ms: float
    kernels: str  # which kernels priced it: system, backend and database version
    harness: str  # the benchmark client whose requests were simulated (harness.py)
    kernel_bound: float  # the kernels' least time for the point's load over the measured (kernel_bound.py)


class PointSimulator:
    """Simulates points one after another, keeping one kernel profile per kind of point."""

    def __init__(self, work: Path | None = None, out_of_phase: bool = False, harness: str = "auto") -> None:
        self.out_of_phase = out_of_phase  # True: a fixed-length harness's warm-up wave spreads the clients out of phase
        self.harness = harness  # auto: each point's own (harness.harness_of)
        self._tmp = tempfile.TemporaryDirectory(prefix="testbed-validate-") if work is None else None
        self.work = Path(self._tmp.name) if self._tmp else Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self._profiles: dict[tuple, tuple[str, str] | PointSkipped] = {}
        self._cost_models: dict[str, object] = {}  # profile path -> its KernelProfileCostModel
        self._by_load: dict[tuple, SimulatedPoint | PointSkipped] = {}  # (MeasuredPoint.load, harness, recipe, prefix cache) -> its result

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def profile(self, p: MeasuredPoint) -> tuple[str, str]:
        """(path, description) of the kernel profile for p; PointSkipped if the database has no kernels for it."""
        from simulator.profiles import kernel_catalog
        from simulator.profiles.kernel_profile import build_kernel_profile

        versions = kernel_catalog.available().get(p.system, {}).get(p.backend, [])
        version = kernel_catalog.nearest_version(versions, p.backend_version)
        kv, layout = self.kv_cache_dtype(p), self.layout(p)
        key = (p.system, p.backend, version, p.model, layout, p.quantization, kv)
        if key not in self._profiles:
            if not versions:
                self._profiles[key] = PointSkipped(f"AIConfigurator has no {p.backend} kernels of {p.system}")
            else:
                try:
                    profile = build_kernel_profile(
                        p.system,
                        p.backend,
                        version,
                        p.model,
                        layout.tp,
                        quantization=p.quantization,
                        kv_cache_dtype=kv,
                        ep=layout.ep,
                        dp=layout.dp,
                        holdout=False,
                    )
                except (kernel_catalog.KernelDatabaseError, ValueError) as e:
                    self._profiles[key] = PointSkipped(f"no kernel profile: {e}")
                else:
                    name = f"tp{layout.tp}-dp{layout.dp}-ep{layout.ep}-{p.precision}-kv{kv}"
                    path = self.work / f"{len(self._profiles)}-{p.system}-{p.backend}-{p.model}-{name}.json"
                    path.write_text(json.dumps(profile) + "\n")
                    used = profile["database"]["backend_version"]
                    self._profiles[key] = (str(path), f"{p.system} {p.backend} {used}")
        found = self._profiles[key]
        if isinstance(found, PointSkipped):
            raise found
        return found

    def recipe(self, p: MeasuredPoint) -> ServerRecipe:
        """The server settings p ran with, as far as its recipe is known (recipes.py)."""
        return server_recipe(p, harness_of(p, self.harness))

    def kv_cache_dtype(self, p: MeasuredPoint) -> str:
        """The KV cache's dtype p ran with: its recipe's, else the engine's default for its model and GPU
        (SGLang's fp8 for sparse attention on Blackwell, testbed/schedulers/sglang.py)."""
        kv = self.recipe(p).kv_cache_dtype
        if kv == "auto" and p.backend == "sglang" and p.config is not None:
            from scheduler.sglang.server_defaults import default_kv_cache_dtype
            from simulator.hardware.specs import HardwareConfigError, database_system_spec

            try:
                kv = default_kv_cache_dtype(p.config.is_dsa, database_system_spec(p.system).sm_version)
            except HardwareConfigError:
                pass  # a system the database lacks: the profile's build says so
        return kv

    def layout(self, p: MeasuredPoint) -> ParallelLayout:
        """How p's server spread the model over its GPUs (recipes.py)."""
        return parallel_layout(p, self.recipe(p))

    def options(self, p: MeasuredPoint, profile: str, prefix_cache: bool = False) -> ReplayOptions:
        """The point's engine with its defaults, but for the server settings its recipe is known
        to have changed (recipes.py). The prompts are random tokens that share no prefix (as the
        benchmarks' random datasets), so a prefix cache never hits: the engines' default (on) and off
        schedule alike (tests/testbed/validate/test_validate.py checks it), and off spares the cache's per-block work
        (a 128-request, 8,192-token vLLM point: 13.6 s on, 1.3 s off)."""
        recipe, layout = self.recipe(p), self.layout(p)
        options = ReplayOptions(
            mode="sim",
            scheduler=p.backend,
            model=p.model,
            tp=layout.tp,
            ep=layout.ep,
            dp=layout.dp,
            enable_dp_attention=layout.dp > 1,
            profile=profile,
            quantization=p.quantization,
            concurrency=p.concurrency,
            seed=0,
            # (a hybrid linear-attention model keeps SGLang's radix cache: with it on, SGLang admits a
            # third of the requests its state pool holds and turns overlap off, scheduler/sglang/mamba_pool.py)
            disable_radix_cache=not (prefix_cache or (p.config is not None and p.config.is_hybrid_linear)),
            scheduler_recv_interval=recipe.scheduler_recv_interval,
            kv_cache_dtype=self.kv_cache_dtype(p),
            mem_fraction_static=recipe.memory_fraction,
        )
        if p.backend == "vllm":
            return replace(
                options,
                max_num_batched_tokens=recipe.max_num_batched_tokens,
                max_num_seqs=recipe.max_running_requests,
                page_size=recipe.block_size,
                max_cudagraph_capture_size=recipe.max_cudagraph_capture_size,
                cudagraph_mode=recipe.cudagraph_mode,
                overlap=recipe.async_scheduling,  # None: the replay's default, on
            )
        return replace(
            options,
            chunked_prefill_size=recipe.chunked_prefill_size,
            max_prefill_tokens=recipe.max_prefill_tokens or options.max_prefill_tokens,
            max_running_requests=recipe.max_running_requests,
        )

    def simulate(self, p: MeasuredPoint, prefix_cache: bool = False) -> SimulatedPoint:
        """p's load replayed in sim; a load simulated before (the file repeats some: 1,343 points it
        can express, 1,101 loads) is not simulated again, only its kernel bound is p's own."""
        harness = harness_of(p, self.harness)
        key = (p.load, harness, self.recipe(p), prefix_cache)
        found = self._by_load.get(key)
        if found is None:
            try:
                found = self._simulate(p, prefix_cache)
            except PointSkipped as e:
                found = e
            self._by_load[key] = found
        if isinstance(found, PointSkipped):
            raise found
        return replace(found, kernel_bound=kernel_bound(self.cost_model(self.profile(p)[0]), p))

    def _simulate(self, p: MeasuredPoint, prefix_cache: bool) -> SimulatedPoint:
        from testbed.errors import USER_ERRORS
        from testbed.replay import replay
        from testbed.runs.folder import load_requests
        from testbed.traces.schema import Trace

        reason = p.skip_reason()
        if reason:
            raise PointSkipped(reason)
        profile, kernels = self.profile(p)
        harness = harness_of(p, self.harness)
        load = workload(p, harness, self.out_of_phase)
        name = f"point-{p.line}"
        trace_path = self.work / f"{name}.jsonl"
        Trace(load.requests).write(trace_path)
        out = self.work / name
        try:
            replay(str(trace_path), self.options(p, profile, prefix_cache), out=out)
        except USER_ERRORS as e:
            raise PointSkipped(f"the simulator refused it: {e}") from None
        requests = load_requests(out, ["rid", "status", "arrival", "first_token", "finish", "output_tokens"])
        shutil.rmtree(out, ignore_errors=True)
        trace_path.unlink()
        steady = requests[requests["rid"].isin(load.measured_rids)]
        done = steady[steady["status"] == "finished"]
        if done.empty:
            raise PointSkipped("no request finished in the simulation (the KV pool cannot hold one)")
        ttft = (done["first_token"] - done["arrival"]).to_numpy()
        multi = done[done["output_tokens"] > 1]
        tpot = ((multi["finish"] - multi["first_token"]) / (multi["output_tokens"] - 1)).to_numpy()
        return SimulatedPoint(
            float(np.mean(ttft)) * 1e3,
            float(np.mean(tpot)) * 1e3 if len(tpot) else float("nan"),
            kernels,
            harness,
            kernel_bound(self.cost_model(profile), p),
        )

    def cost_model(self, profile: str):
        """The KernelProfileCostModel of a profile this simulator built (loaded once)."""
        from simulator.costs.kernel_cost import KernelProfileCostModel

        if profile not in self._cost_models:
            self._cost_models[profile] = KernelProfileCostModel(json.loads(Path(profile).read_text()), profile)
        return self._cost_models[profile]
