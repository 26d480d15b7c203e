"""Link-failure metrics against closed forms (analysis/linkfail.py)."""
import math

import numpy as np
import pytest

from analysis import linkfail as lf


def test_alltoall_bus_bandwidth_is_algbw_times_n_minus_1_over_n():
    # 8 ranks, 1 GiB in 0.5 s: algBW 2 GiB/s, busBW 2·7/8 GiB/s (nccl-tests PERFORMANCE.md)
    assert lf.bus_bandwidth(1 << 30, 0.5, 8) == pytest.approx(2 * (1 << 30) * 7 / 8)
    assert lf.bus_bandwidth(1 << 30, 0.5, 8, "allreduce") == pytest.approx(2 * (1 << 30) * 2 * 7 / 8)
    with pytest.raises(ValueError):
        lf.bus_bandwidth(1, 0.0, 8)
    with pytest.raises(ValueError):
        lf.bus_bandwidth(1, 1.0, 8, "alltoallv")


def test_effective_fraction_of_a_rank_on_one_link_is_one():
    # one rank sends S·(n-1)/n bytes through a link of rate B: time = S(n-1)/(nB), so busBW = B exactly
    n, size, rate = 6, 3.0e9, 12.5e9
    t = size * (n - 1) / n / rate
    assert lf.effective_bandwidth_fraction(lf.bus_bandwidth(size, t, n), rate) == pytest.approx(1.0)


def test_latency_inflation_uses_each_quantile():
    base = np.arange(1, 101, dtype=float)  # p50 50.5, p99 99.01
    failed = base * 1.07
    out = lf.latency_inflation(failed, base)
    assert out["p50"] == pytest.approx(1.07) and out["p99"] == pytest.approx(1.07)
    skew = np.concatenate([base[:-2], [500.0, 1000.0]])
    out = lf.latency_inflation(skew, base)
    assert out["p50"] == pytest.approx(1.0)
    assert out["p99"] == pytest.approx(np.quantile(skew, 0.99) / np.quantile(base, 0.99))
    assert out["p99"] > 4


def test_proportional_bandwidth_is_one():
    assert lf.proportionality(90.0, 100.0, 0.9, 1.0) == pytest.approx(1.0)
    assert lf.proportionality(80.0, 100.0, 0.9, 1.0) == pytest.approx(0.8 / 0.9)


def test_reaction_time_bounds_contain_the_true_recovery():
    # operations of 1 ms back to back; link down at 10 ms; goodput 0 until recovery at 13.5 ms, then 0.5
    start = np.arange(0, 40) * 1e-3
    end = start + 1e-3
    recovery = 13.5e-3
    good = np.where(start < 10e-3, 1.0, np.where(start < recovery, 0.0, 0.5))
    r = lf.reaction_time(start, end, good, down_s=10e-3, steady_from_s=20e-3, steady_to_s=40e-3)
    assert r.reached and r.steady == pytest.approx(0.5)
    assert r.low_s < recovery - 10e-3 <= r.high_s
    assert r.low_s == pytest.approx(3e-3) and r.high_s == pytest.approx(5e-3)


def test_reaction_time_never_reached_and_first_crossing():
    start = np.arange(0, 20) * 1e-3
    end = start + 1e-3
    good = np.ones(20)
    good[5:] = 0.1  # down at 5 ms and never back to 95 % of a steady state of 1.0 ...
    r = lf.reaction_time(start, end, good, down_s=5e-3, steady_from_s=0.0, steady_to_s=5e-3 + 1e-9)
    assert not r.reached and math.isinf(r.high_s)
    r = lf.reaction_time(start, end, good * 0 + 0.1, down_s=5e-3, steady_from_s=0.0, steady_to_s=20e-3,
                         fraction=1.5)
    assert not r.reached and math.isinf(r.high_s) and r.low_s == pytest.approx(14e-3)
    good = np.ones(20)
    good[5:8] = 0.0  # stalled for three operations, then the new steady state
    r = lf.reaction_time(start, end, good, down_s=5e-3, steady_from_s=10e-3, steady_to_s=20e-3)
    assert r.reached and r.low_s == pytest.approx(2e-3) and r.high_s == pytest.approx(4e-3)


def test_inflation_interval_is_over_units_and_says_what_it_needs():
    rng = np.random.default_rng(0)
    base = rng.lognormal(0.0, 0.3, 400)
    failed = 1.07 * rng.lognormal(0.0, 0.3, 400)
    out = lf.inflation_interval(failed, base, 0.5)
    assert out["ci"][0] < 1.07 < out["ci"][1] and out["ci"][1] - out["ci"][0] < 0.3
    assert out["ci"][0] <= out["value"] <= out["ci"][1]
    # the bounds are the order statistics' ratios: at 8 units a side the p50 interval is the 1st and 8th
    small = lf.inflation_interval(np.arange(1.0, 9.0) * 2, np.arange(1.0, 9.0), 0.5)
    assert small["ci"] == pytest.approx([1 * 2 / 8, 8 * 2 / 1])
    # a p99 needs hundreds of units; with 8 a side only what they support, and how many would do
    p99 = lf.inflation_interval(np.arange(1.0, 9.0) * 2, np.arange(1.0, 9.0), 0.99)
    assert p99["ci"] is None and p99["needs_n"] > 300
    assert p99["lower"] is None and p99["upper"] is None  # a p99 upper bound of the baseline needs >= 367 too


def test_iteration_times_sum_the_phases_of_each_unit():
    assert list(lf.iteration_times([1.0, 2.0, 3.0, 4.0], ["a", "a", "b", "c"])) == [3.0, 3.0, 4.0]
    with pytest.raises(ValueError):
        lf.iteration_times([1.0, 2.0], ["a"])


# ---------------------------------------------------------------------------------------- emulated data plane
# (the transfers themselves: tests/test_dataplane.py)

def test_profile_fabric_detection_needs_a_source():
    from devices.emulated.profile import FABRIC_SOURCE_DEFAULT, ProfileError, profile_from_dict

    assert profile_from_dict({}).fabric_detection.mean_s == pytest.approx(1e-3)
    assert profile_from_dict({}).fabric_source == FABRIC_SOURCE_DEFAULT
    with pytest.raises(ProfileError, match="fabric.source"):
        profile_from_dict({"fabric": {"detection": {"dist": "fixed", "ms": 2}}})
    with pytest.raises(ProfileError, match="fabric.delay: Extra inputs"):
        profile_from_dict({"fabric": {"delay": 1}})
