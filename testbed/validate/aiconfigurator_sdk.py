"""AIConfigurator's SDK as `testbed validate` uses it: its modules imported once, which perf
databases it has (system, backend, versions), the version a measured point is estimated at, and
a database loaded once. What cannot be had is an EstimateUnavailable with its reason."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any

from simulator.profiles.kernel_catalog import EXTRA_HINT, latest_version, supported_databases

_SLOT_ALIASES = ("current", "previous", "next")


class EstimateUnavailable(Exception):
    """AIConfigurator cannot estimate this point; ``reason`` says why, in one short line."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# --------------------------------------------------------------------------- the package


@functools.cache
def sdk():
    """The SDK modules this needs, imported once (and its loggers quietened)."""
    try:
        from aiconfigurator_core.sdk import common, perf_database
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.config import RuntimeConfig
        from aiconfigurator_core.sdk.config_builders import build_model_config
        from aiconfigurator_core.sdk.models import check_is_moe, get_model
        from aiconfigurator_core.sdk.models.helpers import (
            resolve_context_fmha_by_data,
            resolve_dsv4_moe_arch,
            resolve_nvfp4_for_system,
        )
    except ImportError as e:
        raise EstimateUnavailable(f"AIConfigurator's SDK is not importable ({e}); {EXTRA_HINT}") from None
    # Its loaders log a line per fallback table and per resolved quant mode; our reasons say what matters.
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return _Sdk(
        common,
        perf_database,
        get_backend,
        RuntimeConfig,
        build_model_config,
        check_is_moe,
        get_model,
        resolve_context_fmha_by_data,
        resolve_dsv4_moe_arch,
        resolve_nvfp4_for_system,
    )


@dataclass(frozen=True)
class _Sdk:
    common: Any
    perf_database: Any
    get_backend: Any
    RuntimeConfig: Any
    build_model_config: Any
    check_is_moe: Any
    get_model: Any
    resolve_context_fmha_by_data: Any
    resolve_dsv4_moe_arch: Any
    resolve_nvfp4_for_system: Any


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    line = re.sub(r" at /\S+", "", line)  # the perf table's path on this machine
    return line if len(line) <= 240 else line[:237] + "..."


def memo(fn):
    """functools.cache that also remembers EstimateUnavailable: a point the SDK cannot estimate is
    asked about again on every row like it (the same model on the same database), and each try costs."""
    results: dict = {}

    @functools.wraps(fn)
    def wrapper(*args):
        try:
            out = results[args]
        except KeyError:
            try:
                out = fn(*args)
            except EstimateUnavailable as e:
                out = e
            results[args] = out
        if isinstance(out, EstimateUnavailable):
            raise EstimateUnavailable(out.reason)
        return out

    wrapper.cache_clear = results.clear
    return wrapper


# --------------------------------------------------------------------------- databases


def supported() -> dict[str, dict[str, tuple[str, ...]]]:
    """system -> backend -> the versions the database can be queried at (its maintained slots; the
    catalog kernel profiles read too, listed once a process)."""
    sdk()  # EstimateUnavailable where the SDK does not import
    return supported_databases()


def _parse_version(version: str):
    """A comparable version for 0.12.0 / 1.2.0rc6.post2 / 0.5.6.post2; None for names that are not
    one (nightly-dev, glm5-hopper, gpt-oss-dev)."""
    from packaging.version import InvalidVersion, Version  # a dependency of aiconfigurator-core

    try:
        return Version(version)
    except InvalidVersion:
        return None


def resolve_database_version(system: str, backend: str, backend_version: str | None) -> str:
    """The database version to use for a point measured with `backend_version`.

    The point's own version where the database has it (or a slot alias: current/previous/next);
    else the oldest maintained version at or after it (the first database that postdates the
    measured engine), else the newest before it; an unparseable or missing version gets the
    database's default ("current", as AIConfigurator's CLI does). Raises EstimateUnavailable for a
    system or backend with no data."""
    return _resolve_version(system, backend, None if backend_version is None else str(backend_version))


@memo
def _resolve_version(system: str, backend: str, backend_version: str | None) -> str:
    have = supported()
    if system not in have:
        raise EstimateUnavailable(f"no perf database for system {system!r} (have: {', '.join(sorted(have))})")
    if backend not in have[system]:
        raise EstimateUnavailable(f"no {backend} perf database for {system} (have: {', '.join(sorted(have[system]))})")
    versions = have[system][backend]
    perf_database = sdk().perf_database
    requested = None if backend_version is None else str(backend_version).strip()
    if requested in versions:
        return requested
    if requested in _SLOT_ALIASES:
        try:
            return perf_database.resolve_query_version(system, backend, requested)
        except ValueError as e:
            raise EstimateUnavailable(first_line(e)) from None
    key = _parse_version(requested) if requested and requested.lower() not in ("nan", "none") else None
    if key is None:
        default = latest_version(system, backend)
        if default is None:
            raise EstimateUnavailable(f"no {backend} perf database for {system}")
        return default
    parsed = sorted((p, v) for p, v in ((_parse_version(v), v) for v in versions) if p is not None)
    if not parsed:
        return latest_version(system, backend) or versions[0]
    later = [v for p, v in parsed if p >= key]
    return later[0] if later else parsed[-1][1]


@memo
def database(system: str, backend: str, version: str):
    the_sdk = sdk()
    try:
        db = the_sdk.perf_database.get_database_view(system, backend, version, allow_missing_data=False, database_mode="SILICON")
    except Exception as e:  # a version outside the slots, a corrupt table
        raise EstimateUnavailable(f"{system}/{backend} {version}: the perf database did not load: {first_line(e)}") from None
    if db is None:
        raise EstimateUnavailable(f"{system}/{backend} {version}: the perf database did not load")
    return db
