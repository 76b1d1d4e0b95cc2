"""Whatever the trace and the options, a replay ends: every request finishes with exactly its
output length (or the cut the summary counts) or is rejected with a reason; never a failed run.

A property over random traces and option values for both schedulers (hypothesis), on pools
from a few pages to ample, pages of 1 to 64 tokens, the radix cache on and off, chunked prefill
from 1 token, overlap on and off.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from testbed.errors import ConfigError
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest

REQUESTS = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 400), st.integers(1, 200)), min_size=1, max_size=12)


@st.composite
def options(draw) -> ReplayOptions:
    scheduler = draw(st.sampled_from(["sglang", "vllm"]))
    page = draw(st.sampled_from([1, 16, 64] if scheduler == "sglang" else [16]))
    common = dict(
        scheduler=scheduler,
        page_size=page,
        kv_tokens=draw(st.integers(64, 2000)),
        disable_radix_cache=draw(st.booleans()),
        overlap=draw(st.booleans()),
        model="tiny-llama",
        hardware="cpu",
    )
    if scheduler == "sglang":
        return ReplayOptions(
            **common,
            chunked_prefill_size=draw(st.sampled_from([None, 1, 64, 512])),
            max_running_requests=draw(st.sampled_from([None, 1, 4])),
        )
    return ReplayOptions(
        **common, max_num_seqs=draw(st.sampled_from([None, 1, 4])), max_num_batched_tokens=draw(st.sampled_from([None, 32, 512]))
    )


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(requests=REQUESTS, opts=options())
def test_every_request_finishes_with_its_length_or_is_rejected_with_a_reason(requests, opts, tmp_path_factory):
    d = tmp_path_factory.mktemp("ends")
    arrivals = sorted(a for a, _, _ in requests)
    trace = Trace([TraceRequest(t, n, o, rid=f"r{i}") for i, (t, (_, n, o)) in enumerate(zip(arrivals, requests))])
    trace.write(d / "t.json")
    try:
        result = replay(str(d / "t.json"), opts, out=d / "run")
    except ConfigError:  # options that cannot go together (a chunk smaller than a page): refused before the run
        assert not (d / "run" / "run.json").exists()
        return
    assert result.status == "complete"
    df = load_run(d / "run").requests.set_index("rid")
    assert len(df) == len(requests)
    for i, (_, _, want) in enumerate(requests):
        rid = f"r{i}"
        row = df.loc[rid]
        if row["status"] == "rejected":
            assert isinstance(row["reason"], str) and row["reason"], rid
            continue
        assert row["status"] == "finished", (rid, row["status"])
        cut = row["max_new_tokens"]
        assert row["output_tokens"] == (want if cut == want else max(cut, 1)), (rid, row["output_tokens"], want, cut)
    s = result.summary
    assert s["completed"] + s["rejected"] == len(requests) and s["unfinished"] == 0
