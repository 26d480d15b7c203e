"""Generators: seeded, and their ground truth (regime changes, burst windows) is where the data changes."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

import traces
from traces.moe import traffic_from_routing
from traces.schema import MoeHeader


def destination_shares(trace) -> np.ndarray:
    """Per iteration: share of dispatch bytes per (layer, dst rank)."""
    d = trace.traffic[trace.traffic["phase"] == "dispatch_fwd"]
    table = d.pivot_table(index="iteration", columns=["layer", "dst_rank"], values="bytes", aggfunc="sum",
                          fill_value=0).to_numpy(dtype=float)
    return table / table.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_regime_changes_are_where_routing_jumps(seed):
    # One expert per rank, so destination shares are expert popularities.
    trace = traces.generate_moe(seed=seed, iterations=30, layers=2, micro_batches=1, num_experts=16, top_k=2,
                                ep=16, tokens_per_micro_batch=2048, drift=0.02, regime_changes=3,
                                backward=False)
    shares = destination_shares(trace)
    jump = 0.5 * np.abs(np.diff(shares, axis=0)).sum(axis=1)  # total variation between iterations i-1 and i
    changes = np.asarray(trace.regime_changes)
    assert len(changes) == 3
    quiet = np.delete(jump, changes - 1)
    assert set(np.argsort(jump)[-3:] + 1) == set(changes)
    # Large effect: a reshuffle of Zipf(1.2) popularity moves far more mass than drift plus sampling noise.
    assert jump[changes - 1].min() > 4 * quiet.max()


def test_regions_confine_traffic_and_seed_reproduces():
    kwargs = dict(seed=11, iterations=4, regime_changes=[2], layers=2, num_experts=8, ep=4, regions=3, tokens_per_micro_batch=256)
    trace = traces.generate_moe(**kwargs)
    t = trace.traffic
    assert (t["src_rank"] // 4 == t["dst_rank"] // 4).all()
    assert t["src_rank"].nunique() == 12
    pd.testing.assert_frame_equal(t, traces.generate_moe(**kwargs).traffic)
    assert not traces.generate_moe(**{**kwargs, "seed": 12}).traffic.equals(t)


def test_moe_token_conservation():
    trace = traces.generate_moe(seed=4, iterations=3, regime_changes=0, layers=2, micro_batches=2, num_experts=8, top_k=2, ep=4,
                                regions=2, tokens_per_micro_batch=100, hidden_size=10, dtype_bytes=2)
    per_phase = trace.traffic.groupby("phase", observed=True)["bytes"].sum()
    expected = 3 * 2 * 2 * 8 * 100 * 2 * 20  # iterations·layers·micro-batches·ranks·tokens·top_k·bytes
    assert per_phase.to_dict() == {p: expected for p in traces.MOE_PHASES}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(2, 6), st.data())
def test_traffic_from_routing_properties(ep, groups, experts, data):
    placement = tuple(data.draw(st.lists(st.integers(0, ep - 1), min_size=experts, max_size=experts)))
    header = MoeHeader(num_experts=experts, top_k=1, hidden_size=3, dtype_bytes=1, ep=ep, n_ranks=ep * groups,
                       expert_placement=placement)
    n = ep * groups
    counts = np.asarray(data.draw(st.lists(st.lists(st.integers(0, 9), min_size=experts, max_size=experts),
                                           min_size=n, max_size=n)), dtype=np.int64)
    routing = pd.DataFrame([(0, 0, 0, s, e, counts[s, e]) for s in range(n) for e in range(experts)],
                           columns=["iteration", "layer", "micro_batch", "src_rank", "expert", "tokens"])
    trace = traces.MoeTrace(header, traffic_from_routing(routing, header))
    phases = {p.phase: p.matrix for p in traces.moe_phases(trace)}
    oracle = np.zeros((n, n), dtype=np.int64)
    for s in range(n):
        for e in range(experts):
            oracle[s, (s // ep) * ep + placement[e]] += 3 * counts[s, e]
    if oracle.sum() == 0:
        assert phases == {}
        return
    np.testing.assert_array_equal(phases["dispatch_fwd"], oracle)
    np.testing.assert_array_equal(phases["combine_fwd"], oracle.T)
    np.testing.assert_array_equal(phases["combine_bwd"], oracle)
    np.testing.assert_array_equal(phases["dispatch_bwd"], oracle.T)


def test_moe_phases_order_backward_reverses_layers():
    trace = traces.generate_moe(seed=0, iterations=1, layers=3, micro_batches=2, num_experts=4, top_k=1, ep=2,
                                tokens_per_micro_batch=16, regime_changes=0)
    order = [(p.micro_batch, p.layer, p.phase) for p in traces.moe_phases(trace)]
    fwd = [(mb, l, ph) for mb in (0, 1) for l in (0, 1, 2) for ph in ("dispatch_fwd", "combine_fwd")]
    expected = []
    for mb in (0, 1):
        expected += [x for x in fwd if x[0] == mb]
        expected += [(mb, l, ph) for l in (2, 1, 0) for ph in ("combine_bwd", "dispatch_bwd")]
    assert order == expected


def test_poisson_rate_and_exponential_gaps():
    frame = traces.poisson_arrivals(seed=3, rate=20.0, duration_s=500.0)
    n = len(frame)
    assert abs(n - 10_000) < 5 * np.sqrt(10_000)
    gaps = np.diff(frame["arrival_s"].to_numpy())
    assert stats.kstest(gaps, "expon", args=(0, 1 / 20.0)).pvalue > 1e-3
    assert (frame["prompt_tokens"] >= 1).all() and (frame["output_tokens"] >= 1).all()


@pytest.mark.parametrize("seed", [5, 6])
def test_mmpp_burst_windows_hold_the_bursts(seed):
    b = traces.mmpp_arrivals(seed=seed, base_rate=2.0, burst_rate=100.0, duration_s=600.0, mean_burst_s=5.0,
                             mean_gap_s=30.0)
    t = b.requests["arrival_s"].to_numpy()
    assert len(b.bursts) >= 5
    starts, ends = b.bursts["start_s"].to_numpy(), b.bursts["end_s"].to_numpy()
    inside = np.zeros(len(t), dtype=bool)
    for s, e in zip(starts, ends):
        inside |= (t >= s) & (t < e)
    burst_time = (ends - starts).sum()
    rate_in, rate_out = inside.sum() / burst_time, (~inside).sum() / (600.0 - burst_time)
    assert rate_in > 20 * rate_out
    # Counts agree with the declared rates (Poisson, 6 sigma).
    assert abs(inside.sum() - 100.0 * burst_time) < 6 * np.sqrt(100.0 * burst_time)
    assert abs((~inside).sum() - 2.0 * (600 - burst_time)) < 6 * np.sqrt(2.0 * (600 - burst_time))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 12))
def test_diloco_windows_respect_gaps(seed, count):
    w = traces.diloco_sync_windows(seed=seed, count=count, duration_s=600.0, window_s=8.0, min_gap_s=18.0)
    starts = w["start_s"].to_numpy()
    assert len(w) == count
    assert starts[0] >= 0 and starts[-1] + 8.0 <= 600.0 + 1e-9
    assert (np.diff(starts) >= 18.0 - 1e-9).all()


def test_diloco_windows_that_cannot_fit():
    with pytest.raises(ValueError):
        traces.diloco_sync_windows(seed=0, count=40, duration_s=600.0)
