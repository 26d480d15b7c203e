"""Stage tables and summaries against brute force and scipy."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from hypothesis import given, settings, strategies as st

from analysis.stats import (CHAIN, UP_STAGES, cluster_bootstrap, cycle_means, mean_interval, ocs_switch_times,
                            p99_interval_text, per_cycle, quantile_needs_n, stage_table, summarize, summarize_events,
                            turnaround)
from harness.record import summary_markdown


def synthetic_events(rng, cycles=5, ports=(("gpu1", "p0"), ("gpu1", "p1"), ("gpu2", "p0")), drop=0.0):
    """Events with random stage gaps; returns (events, truth) where truth[(cycle, host, port)][stage] = t."""
    rows, truth, sent_of = [], {}, {}
    for c in range(cycles):
        sent = 10**12 * (c + 1) + int(rng.integers(0, 10**6))
        # Two OCS commands: the earliest send and the latest completion define the cycle.
        done = sent + int(rng.integers(30, 60) * 10**6)
        rows += [(c, "ocs_command_sent", "harness", "ocs1", sent), (c, "ocs_command_sent", "harness", "ocs2", sent + 5),
                 (c, "ocs_command_completed", "harness", "ocs1", done - 7), (c, "ocs_command_completed", "harness", "ocs2", done)]
        sent_of[c] = (sent, done)
        for host, port in ports:
            t = done + int(rng.integers(-10**5, 10**6))
            times = {}
            for stage in UP_STAGES[1:]:
                times[stage] = t
                t += int(rng.integers(10**5, 10**9))
            times["light_lost"] = t + 10**9
            times["port_down"] = times["light_lost"] + int(rng.integers(10**5, 10**7))
            for stage, value in times.items():
                if rng.random() < drop:
                    continue
                truth.setdefault((c, host, port), {})[stage] = value
                rows.append((c, stage, host, port, value))
                if rng.random() < 0.2:  # a later repeat (flap) must not count
                    rows.append((c, stage, host, port, value + 10**9))
    order = rng.permutation(len(rows))
    frame = pd.DataFrame([rows[i] for i in order], columns=["cycle", "stage", "host", "port", "t_ns"])
    return frame, truth, sent_of


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), drop=st.sampled_from([0.0, 0.15]))
def test_stage_table_matches_brute_force(seed, drop):
    rng = np.random.default_rng(seed)
    events, truth, sent_of = synthetic_events(rng, cycles=int(rng.integers(1, 5)), drop=drop)
    table = stage_table(events)
    for key, stages in truth.items():
        sent, done = sent_of[key[0]]
        row = table.loc[key]
        stages = dict(stages, ocs_command_completed=done)
        for stage in UP_STAGES:
            want = stages[stage] - sent if stage in stages else np.nan
            assert row[stage] == pytest.approx(want, nan_ok=True), (key, stage)
        for name, (later, earlier) in CHAIN.items():
            want = stages[later] - stages[earlier] if later in stages and earlier in stages else np.nan
            assert row[f"chain_{name}"] == pytest.approx(want, nan_ok=True), (key, name)
    for c, (sent, done) in sent_of.items():
        fp = [s["first_packet"] for (cc, _, _), s in truth.items() if cc == c and "first_packet" in s]
        if fp:
            assert turnaround(events)[c] == max(fp) - sent
        else:
            assert c not in turnaround(events).index
        assert ocs_switch_times(events)[c] == done - sent


def test_empty_events():
    events = pd.DataFrame({"cycle": [], "stage": [], "host": [], "port": [], "t_ns": []})
    assert stage_table(events).empty and turnaround(events).empty
    assert summarize_events(events, 0)["turnaround"]["n"] == 0


def test_summarize_against_numpy_and_scipy():
    rng = np.random.default_rng(3)
    x = rng.lognormal(3.0, 0.4, size=400)
    s = summarize(np.append(x, np.nan), rng_seed=11)
    assert s["n"] == s["n_cycles"] == 400 and s["max"] == x.max() and s["mean"] == pytest.approx(x.mean())
    assert [s["p50"], s["p90"], s["p99"]] == pytest.approx(np.quantile(x, [0.5, 0.9, 0.99]).tolist())
    assert s["mean_ci95"] == mean_interval(x, rng_seed=11)
    lo, hi = s["p99_ci95"]
    assert [lo, hi] == order_statistic_interval(x, 0.99, 0.95)
    assert summarize(x, rng_seed=11) == s  # seeded: reproducible


def order_statistic_interval(x, p, confidence):
    """Brute force: the equal-tailed ranks (1-based) whose binomial tails each stay below α/2."""
    n, tail = len(x), (1 - confidence) / 2
    xs = np.sort(x)
    cdf = scipy.stats.binom.cdf(np.arange(n + 1), n, p)  # P(#below the quantile <= k)
    r = max(k for k in range(1, n + 1) if cdf[k - 1] <= tail)  # P(X_(r) > q) <= α/2
    s = min(k for k in range(1, n + 1) if 1 - cdf[k - 1] <= tail)  # P(X_(s) < q) <= α/2
    return [float(xs[r - 1]), float(xs[s - 1])]


def test_p99_needs_368_units_for_a_two_sided_95_interval():
    assert quantile_needs_n(0.99) == 368 and quantile_needs_n(0.5) == 6
    rng = np.random.default_rng(0)
    for p, n, supported in ((0.99, 367, False), (0.99, 368, True), (0.5, 5, False), (0.5, 6, True)):
        ci = scipy.stats.quantile_test(rng.normal(size=n), p=p).confidence_interval(0.95)
        assert (np.isfinite(ci.high) and np.isfinite(ci.low)) == supported, (p, n)
    # exact coverage of the order-statistic interval at n = 400 is at least nominal and not far above
    n, tail = 400, 0.025
    cdf = scipy.stats.binom.cdf(np.arange(n + 1), n, 0.99)
    r = max(k for k in range(1, n + 1) if cdf[k - 1] <= tail)
    s_ = min(k for k in range(1, n + 1) if 1 - cdf[k - 1] <= tail)
    coverage = cdf[s_ - 1] - cdf[r - 1]
    assert 0.95 <= coverage <= 0.98


@pytest.mark.parametrize("n", [2, 10, 80, 367])
def test_no_p99_interval_where_n_cannot_support_it(n):
    x = np.random.default_rng(n).lognormal(3.0, 0.4, size=n)
    s = summarize(x, rng_seed=0)
    assert s["p99_ci95"] is None and s["p99_needs_cycles"] == 368
    # the one-sided lower bound the data do support: the largest order statistic whose
    # P(X_(r) > q99) = P(Bin(n, 0.99) < r) stays <= 5 %
    cdf = scipy.stats.binom.cdf(np.arange(n + 1), n, 0.99)
    r = max(k for k in range(1, n + 1) if cdf[k - 1] <= 0.05)
    assert s["p99_bound95"]["lower"] == np.sort(x)[r - 1]
    text = p99_interval_text(s)
    assert text.startswith("p99 needs ≥ 368 cycles; p99 ≥ ") and "–" not in text
    assert "p99 needs ≥ 368 cycles" in summary_markdown({"turnaround": s})


def test_p99_interval_counts_cycles_not_ports():
    """400 per-port samples from 50 cycles are 50 independent units: no p99 interval."""
    rng = np.random.default_rng(1)
    cycles = np.repeat(np.arange(50), 8)
    x = np.repeat(rng.normal(50, 7, 50), 8) + rng.normal(0, 0.1, 400)
    s = summarize(x, rng_seed=0, cycles=cycles)
    assert s["n"] == 400 and s["n_cycles"] == 50 and s["p99_ci95"] is None
    assert summarize(x, rng_seed=0)["p99_ci95"] is not None  # the i.i.d. reading would print one


def test_mean_interval_is_over_cycle_means():
    rng = np.random.default_rng(2)
    cycles = np.repeat(np.arange(10), 8)
    x = np.repeat(rng.normal(50, 7, 10), 8) + rng.normal(0, 0.1, 80)
    s = summarize(x, rng_seed=0, cycles=cycles)
    assert s["mean_ci95"] == pytest.approx(mean_interval(x.reshape(10, 8).mean(axis=1), rng_seed=0), rel=1e-12)
    lo, hi = s["mean_ci95"]
    naive = scipy.stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert (hi - lo) > 2.5 * (naive.high - naive.low)  # pseudo-replication would be this narrow


def test_cluster_bootstrap_keeps_each_cycle_whole():
    """Every resample holds whole cycles: a cycle's 8 port samples never split or mix."""
    cycles = np.repeat(np.arange(12), 8)
    x = cycles * 10.0 + np.tile(np.arange(8), 12) / 100  # cycle k: k*10 + port/100
    seen = []

    def statistic(values, index):
        for k in range(index.max() + 1):
            group = values[index == k]
            assert len(group) == 8 and np.ptp(np.floor(group / 10)) == 0
            assert sorted(np.round(group % 10, 2)) == [p / 100 for p in range(8)]
        seen.append(len(values))
        return values.mean()

    out = cluster_bootstrap(x, cycles, statistic, rng_seed=0, n_resamples=50)
    assert out["n_cycles"] == 12 and out["estimate"] == pytest.approx(x.mean())
    assert out["ci"][0] < x.mean() < out["ci"][1] and set(seen) == {96}


def test_cluster_bootstrap_matches_scipy_on_cycle_means():
    """With equal cycle sizes, resampling whole cycles for the pooled mean is the bootstrap of cycle means."""
    rng = np.random.default_rng(5)
    cycles = np.repeat(np.arange(30), 4)
    x = np.repeat(rng.normal(0, 1, 30), 4) + rng.normal(0, 0.2, 120)
    out = cluster_bootstrap(x, cycles, lambda v, i: v.mean(), rng_seed=7, n_resamples=999)
    ref = scipy.stats.bootstrap((x.reshape(30, 4).mean(axis=1),), np.mean, n_resamples=999, method="percentile",
                                random_state=np.random.default_rng(7)).confidence_interval
    assert out["ci"] == pytest.approx([ref.low, ref.high])


def test_mean_ci_coverage_is_near_nominal_for_clustered_data():
    rng = np.random.default_rng(4)
    hits = 0
    cycles = np.repeat(np.arange(10), 8)
    for i in range(400):  # summarize's mean_ci95 is this (test_mean_interval_is_over_cycle_means)
        shared = rng.normal(50, 7, 10)
        x = np.repeat(shared, 8) + rng.normal(0, 1, 80)
        lo, hi = mean_interval(cycle_means(x, cycles), rng_seed=i, n_resamples=499)
        hits += lo <= 50 <= hi
    assert 0.92 <= hits / 400 <= 0.98


def test_mean_interval_holds_its_level_on_skewed_delays_where_student_t_does_not():
    """10 cycles of a lognormal σ 0.6: Student-t covers ~90.5 %, the bootstrap-t ~93.6 % (coverage.py)."""
    rng = np.random.default_rng(8)
    truth = 40.0 * np.exp(0.18)
    boot = student = 0
    reps = 600
    for i in range(reps):
        x = rng.lognormal(np.log(40.0), 0.6, size=10)
        lo, hi = mean_interval(x, rng_seed=i, n_resamples=499)
        boot += lo <= truth <= hi
        ref = scipy.stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
        student += ref.low <= truth <= ref.high
    assert boot / reps >= 0.92 and boot > student


def test_per_cycle_quantities_count_once_per_cycle():
    rng = np.random.default_rng(9)
    events, _, _ = synthetic_events(rng, cycles=4)
    out = summarize_events(events, 0)
    assert out["stages"]["ocs_command_completed"]["n"] == 4 and out["ocs_switch"]["n"] == 4
    assert out["stages"]["light_detected"]["n"] == 12 and out["stages"]["light_detected"]["n_cycles"] == 4
    table = stage_table(events)
    assert per_cycle(table, "first_packet").to_numpy() == pytest.approx(turnaround(events).to_numpy())


def test_summarize_small_inputs():
    assert summarize([], 0)["n"] == 0 and np.isnan(summarize([], 0)["mean"])
    one = summarize([5.0], 0)
    assert one["mean_ci95"] is None and one["p99"] == 5.0 and one["p99_ci95"] is None
    assert summarize([5.0] * 5, 0)["mean_ci95"] == [5.0, 5.0]


def test_no_mean_interval_below_the_cycles_where_its_coverage_holds():
    """At 2 cycles every bootstrap-t resample has t = 0: the interval collapsed onto the mean (coverage 0 %);
    below MIN_MEAN_UNITS none is given, and the report says how many cycles one needs."""
    from analysis.stats import MIN_MEAN_UNITS, mean_interval_text

    assert mean_interval([2.1, 4.0]) is None and mean_interval([2.1, 4.0, 3.0, 2.5]) is None
    lo, hi = mean_interval([2.1, 4.0, 3.0, 2.5, 3.3])
    assert lo < 2.98 < hi  # the mean, strictly inside
    s = summarize([2.1, 4.0], 0)
    assert s["mean_ci95"] is None and mean_interval_text(s) == f"needs ≥ {MIN_MEAN_UNITS} cycles"


def test_the_difference_interval_matches_welch_where_the_means_are_normal():
    """Oracle: for large normal samples the two-sample bootstrap-t interval of mean(b) − mean(a) approaches
    Welch's t interval; below MIN_DIFFERENCE_UNITS cycles a side none is given."""
    from scipy import stats as st

    from analysis.stats import MIN_DIFFERENCE_UNITS, mean_difference_interval

    rng = np.random.default_rng(4)
    a, b = rng.normal(10.0, 2.0, 400), rng.normal(11.0, 3.0, 300)
    lo, hi = mean_difference_interval(a, b, rng_seed=1)
    welch = st.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert lo == pytest.approx(welch.low, abs=0.05) and hi == pytest.approx(welch.high, abs=0.05)
    assert mean_difference_interval(a[:MIN_DIFFERENCE_UNITS - 1], b) is None
    assert mean_difference_interval(a, b[:MIN_DIFFERENCE_UNITS]) is not None


def test_blocks_of_cycles_summarise_as_their_events_together():
    """A long campaign's summary is made a block of cycles at a time (harness.finish): the blocks' tables, in
    cycle order, give the summary of all the events at once, bit for bit."""
    from analysis.stats import cycle_tables, summarize_cycle_tables

    events, _, _ = synthetic_events(np.random.default_rng(5), cycles=40, drop=0.1)
    whole = summarize_events(events, 7)
    for size in (1, 7, 40):
        blocks = [cycle_tables(events[(events["cycle"] >= a) & (events["cycle"] < a + size)])
                  for a in range(0, 40, size)]
        assert summarize_cycle_tables(blocks, 7) == whole


def test_the_bootstrap_draws_its_resamples_in_blocks_the_same_as_at_once_where_one_block_holds_them(monkeypatch):
    import analysis.stats as stats

    x = np.random.default_rng(4).lognormal(3, 0.5, size=300)
    # the studentised bootstrap with every resample drawn at once (the formula before blocks)
    rng = np.random.default_rng(9)
    resampled = x[rng.integers(0, 300, size=(1999, 300))]
    se = x.std(ddof=1) / np.sqrt(300)
    t_star = (resampled.mean(axis=1) - x.mean()) / (resampled.std(axis=1, ddof=1) / np.sqrt(300))
    lo_q, hi_q = np.quantile(t_star, [0.025, 0.975])
    assert mean_interval(x, rng_seed=9) == pytest.approx([x.mean() - hi_q * se, x.mean() - lo_q * se], rel=1e-12)
    monkeypatch.setattr(stats, "_RESAMPLE_VALUES", 300 * 64)  # 64 resamples a block: another stream of them
    assert mean_interval(x, rng_seed=9) == pytest.approx([x.mean() - hi_q * se, x.mean() - lo_q * se], rel=0.01)


def test_from_many_cycles_the_mean_interval_is_the_bootstrap_t_expanded_and_holds_its_level(monkeypatch):
    """From EDGEWORTH_MEAN_UNITS cycles the bootstrap-t's quantiles come from their Edgeworth expansion: oracle 1,
    the resampled bootstrap-t on the same data (within 2 % of the width, both ends, and as lopsided about the mean
    on right-skewed delays); oracle 2, its coverage of a known mean over 400 campaigns of heavily skewed delays."""
    import analysis.stats as stats

    n = stats.EDGEWORTH_MEAN_UNITS
    x = np.random.default_rng(5).lognormal(0.0, 1.0, size=n)
    expanded = mean_interval(x, rng_seed=3)
    monkeypatch.setattr(stats, "EDGEWORTH_MEAN_UNITS", 10 * n)
    resampled = mean_interval(x, rng_seed=3, n_resamples=4999)
    monkeypatch.undo()
    width = resampled[1] - resampled[0]
    assert abs(expanded[0] - resampled[0]) < 0.02 * width and abs(expanded[1] - resampled[1]) < 0.02 * width
    assert expanded[1] - x.mean() > x.mean() - expanded[0]  # right-skewed delays: further above than below
    rng, truth, hits = np.random.default_rng(6), np.exp(0.5), 0
    for _ in range(400):
        lo, hi = mean_interval(rng.lognormal(0.0, 1.0, size=n))
        hits += lo <= truth <= hi
    assert 0.92 <= hits / 400 <= 0.98


def test_from_many_cycles_a_side_the_difference_interval_is_its_bootstrap_t_expanded(monkeypatch):
    """Oracle: the resampled two-sample bootstrap-t on the same two campaigns (within 3 % of its width, both ends)."""
    import analysis.stats as stats

    rng = np.random.default_rng(7)
    n = stats.EDGEWORTH_MEAN_UNITS
    a, b = rng.lognormal(0.0, 1.0, n + 1000), rng.lognormal(0.05, 1.2, n)
    expanded = stats.mean_difference_interval(a, b)
    monkeypatch.setattr(stats, "EDGEWORTH_MEAN_UNITS", 10 ** 9)
    resampled = stats.mean_difference_interval(a, b, n_resamples=4999)
    width = resampled[1] - resampled[0]
    assert abs(expanded[0] - resampled[0]) < 0.03 * width and abs(expanded[1] - resampled[1]) < 0.03 * width
