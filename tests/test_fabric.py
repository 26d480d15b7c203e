"""The leaf–spine fabric model (analysis/fabric.py) against oracles: max-min fairness against a sequence of
linear programs, ECMP collisions against brute force over every hash outcome, spraying against the closed
form of bandwidth proportional to the surviving capacity."""
import itertools
import math

import numpy as np
import pytest
from scipy.optimize import linprog

from analysis import fabric as fb


def lp_max_min(w, cap):
    """Max-min fair rates by the textbook LP sequence: raise the smallest unfixed rate as far as it goes,
    then fix every flow that cannot exceed that level (its own LP), until all are fixed."""
    n = w.shape[0]
    fixed = np.full(n, np.nan)
    while np.isnan(fixed).any():
        free = np.isnan(fixed)
        # variables: r (n), t; max t s.t. W^T r <= cap, r_f >= t (free), r_f = fixed (fixed)
        a_ub = np.hstack([w.T, np.zeros((w.shape[1], 1))])
        a_ub = np.vstack([a_ub, np.hstack([-np.eye(n)[free], np.ones((free.sum(), 1))])])
        b_ub = np.r_[cap, np.zeros(free.sum())]
        bounds = [(v, v) if not np.isnan(v) else (0, None) for v in fixed] + [(0, None)]
        t = -linprog(np.r_[np.zeros(n), -1.0], A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs").fun
        for f in np.flatnonzero(free):
            c = np.zeros(n + 1)
            c[f] = -1.0
            b2 = bounds[:-1] + [(t, t)]
            best = -linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=b2, method="highs").fun
            if best <= t * (1 + 1e-7) + 1e-12:
                fixed[f] = t
    return fixed


@pytest.mark.parametrize("seed", range(6))
def test_max_min_rates_match_the_lp_sequence(seed):
    rng = np.random.default_rng(seed)
    flows, links = 7, 5
    w = rng.random((flows, links)) * (rng.random((flows, links)) < 0.5)
    w[np.arange(flows), rng.integers(0, links, flows)] += 0.5  # every flow crosses some link
    cap = rng.uniform(0.5, 3.0, links)
    got = fb.max_min_rates(w, cap)
    assert got == pytest.approx(lp_max_min(w, cap), rel=1e-6)
    assert (w.T @ got <= cap * (1 + 1e-9)).all()


def test_max_min_rates_on_a_routed_fabric_match_the_lp_sequence():
    fabric = fb.LeafSpine(endpoints=4, planes=2, per_leaf=2, spines=2, nic_gbps=8, uplink_gbps=1)
    flows = fb.alltoall_flows(4, 1.0)
    for mode in ("ecmp", "spray"):
        w = fb.route_matrix(fabric, flows, mode, seed=3)
        cap = fabric.capacities([(0, 0, 1)])
        assert fb.max_min_rates(w, cap) == pytest.approx(lp_max_min(w, cap), rel=1e-6, abs=1e-9)


def test_a_flow_on_a_dark_link_stalls_and_one_without_route_gets_nothing():
    w = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    assert list(fb.max_min_rates(w, np.array([0.0, 2.0]))) == [0.0, 2.0, 0.0]


def two_leaves(spines):
    # one NIC per leaf and plane: every flow crosses the spines; NIC ports far faster than the uplinks
    return fb.LeafSpine(endpoints=2, planes=1, per_leaf=1, spines=spines, nic_gbps=1000, uplink_gbps=8)


def test_ecmp_collisions_against_every_hash_outcome():
    """n flows 0 → 1 pinned to S spines: the fluid ends at bytes · (most flows on one spine) / uplink rate;
    over all S^n equally likely outcomes its mean is E[max load], 2.25 for 3 flows on 2 spines."""
    spines, n, size = 2, 3, 1e6
    fabric = two_leaves(spines)
    flows = fb.Flows(np.array([[0, 1, q] for q in range(n)]), np.full(n, size))
    cap = fabric.capacities()
    rate = 8 * fb.BYTES_PER_GBIT
    times = []
    for assign in itertools.product(range(spines), repeat=n):
        w = np.zeros((n, fabric.n_links))
        for f, s in enumerate(assign):
            w[f, [fabric.up(0, 0), fabric.to_spine(0, 0, s), fabric.from_spine(0, 1, s), fabric.down(0, 1)]] = 1
        segments, left = fb.fluid(w, cap, flows.bytes)
        assert not left.any()
        times.append(segments[-1][1])
        assert segments[-1][1] == pytest.approx(size * max(np.bincount(assign, minlength=spines)) / rate)
    assert np.mean(times) == pytest.approx(2.25 * size / rate)
    # the model's own hashing: its time is the closed form of the outcome it drew
    w = fb.route_matrix(fabric, flows, "ecmp", seed=5)
    load = [int(w[:, fabric.to_spine(0, 0, s)].sum()) for s in range(spines)]
    assert fb.simulate(fabric, flows, "ecmp", seed=5).max() == pytest.approx(size * max(load) / rate)
    # spraying splits every flow over both spines: n / S flows' worth per spine
    assert fb.simulate(fabric, flows, "spray").max() == pytest.approx(size * n / spines / rate)


def test_ecmp_moves_only_the_flows_of_a_lost_path():
    fabric = fb.LeafSpine(endpoints=8, planes=2, per_leaf=2, spines=4, nic_gbps=800)
    flows = fb.alltoall_flows(8, 1.0, qps=2)
    before = fb.route_matrix(fabric, flows, "ecmp", seed=1)
    lost = (1, 0, 2)
    after = fb.route_matrix(fabric, flows, "ecmp", out=[lost], seed=1)
    on_lost = before[:, fabric.to_spine(*lost)] + before[:, fabric.from_spine(*lost)] > 0
    assert on_lost.any()
    assert (before[~on_lost] == after[~on_lost]).all()
    assert not after[:, [fabric.to_spine(*lost), fabric.from_spine(*lost)]].any()


def test_spraying_is_proportional_to_the_surviving_capacity_when_every_leaf_loses_alike():
    """One NIC per leaf, NIC port rate = S uplinks: NIC- and uplink-bound alike. Every leaf loses k of its
    S uplinks (a derangement of spines, so no spine loses two of a leaf pair): time × S/(S−k) exactly,
    bandwidth kept = capacity kept."""
    spines, leaves, planes, k = 4, 4, 2, 1
    fabric = fb.LeafSpine(endpoints=leaves, planes=planes, per_leaf=1, spines=spines, nic_gbps=planes * spines * 10,
                          uplink_gbps=10)
    dark = [(p, leaf, (leaf + p) % spines) for p in range(planes) for leaf in range(leaves)]
    kept_capacity = fabric.fabric_capacity(dark) / fabric.fabric_capacity()
    assert kept_capacity == pytest.approx((spines - k) / spines)
    base = fb.alltoall_time(fabric, 1e6, "adaptive")
    assert base == pytest.approx(fb.line_time(fabric, 1e6))
    failed = fb.alltoall_time(fabric, 1e6, "adaptive", dark)
    assert (base / failed) / kept_capacity == pytest.approx(1.0, rel=1e-6)
    # even spraying: each flow over the paths whose both leaf links survive; no better than adaptive
    assert fb.alltoall_time(fabric, 1e6, "spray", dark) >= failed * (1 - 1e-9)
    # ECMP on the same fabric: its collisions keep it below line rate even with nothing failed
    assert fb.alltoall_time(fabric, 1e6, "ecmp", seed=2) > base * 1.05


def test_flap_stalls_the_flows_on_the_link_until_detection_then_routes_around():
    """One flow per spine pair-wise pinned by spraying over 2 spines: the link down at t0 for d stalls the
    sprayed flow (half its packets on it) for the detection delay; then the other spine carries it alone."""
    fabric = two_leaves(2)
    rate = 8 * fb.BYTES_PER_GBIT
    size = 2 * rate * 10e-3  # 10 ms over both spines
    flows = fb.Flows(np.array([[0, 1, 0]]), np.array([size]))
    t0, detect, down = 2e-3, 1e-3, 4e-3
    states = fb.flap_states([((0, 0, 1), t0, down)], detect)
    finish = fb.simulate(fabric, flows, "spray", states)[0]
    # 2 ms at 2·rate, 1 ms stalled, 3 ms at rate (routed around), then back at 2·rate
    moved = 2 * rate * t0 + rate * (down - detect)
    assert finish == pytest.approx(t0 + down + (size - moved) / (2 * rate))
    assert fb.simulate(fabric, flows, "spray")[0] == pytest.approx(10e-3)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        fb.LeafSpine(endpoints=1, planes=2, per_leaf=1, spines=1, nic_gbps=1)
    with pytest.raises(ValueError):
        fb.route_matrix(two_leaves(2), fb.alltoall_flows(2, 1.0), "roundrobin")
    assert math.isinf(fb.alltoall_time(two_leaves(1), 1.0, "spray", [(0, 0, 0)]))
