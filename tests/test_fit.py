"""Distribution fitting against known generators (oracle tests) and scipy's estimators."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.fit import FitError, _gamma_mle, fit_delay, ks_pvalue, ports_differ
from devices.emulated.profile import Delay

Z99 = stats.norm.ppf(0.99)


def inside(ci, value):
    return ci[0] <= value <= ci[1]


@pytest.mark.parametrize("seed", [0, 1])
def test_lognormal_recovered_within_ci(seed):
    rng = np.random.default_rng(100 + seed)
    mu, sigma = math.log(40.0), 0.35
    x = rng.lognormal(mu, sigma, size=600)
    fit = fit_delay(x, rng_seed=seed)
    assert fit.choice == "lognormal", fit.candidates
    true_mean, true_p99 = math.exp(mu + sigma**2 / 2), math.exp(mu + Z99 * sigma)
    assert inside(fit.ci95["mean_ms"], true_mean) and inside(fit.ci95["p99_ms"], true_p99), fit.ci95
    assert fit.spec["dist"] == "lognormal" and fit.spec["mean_ms"] == pytest.approx(true_mean, rel=0.05)
    # The spec is loadable and round-trips to the fitted distribution.
    delay = Delay.from_spec(fit.spec)
    assert delay.quantile(0.99) * 1e3 == pytest.approx(fit.spec["p99_ms"], rel=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_gamma_recovered_within_ci(seed):
    rng = np.random.default_rng(200 + seed)
    shape, scale = 2.0, 3.0
    x = rng.gamma(shape, scale, size=600)
    fit = fit_delay(x, rng_seed=seed)
    assert fit.choice == "gamma", fit.candidates
    assert inside(fit.ci95["mean_ms"], shape * scale) and inside(fit.ci95["cv"], 1 / math.sqrt(shape)), fit.ci95
    assert Delay.from_spec(fit.spec).mean_s * 1e3 == pytest.approx(fit.spec["mean_ms"], rel=1e-4)


def test_mixture_gives_empirical():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.lognormal(math.log(5), 0.1, 300), rng.lognormal(math.log(50), 0.1, 300)])
    fit = fit_delay(x, rng_seed=1)
    assert fit.choice == "empirical" and all(c["ks_p"] < 0.05 for c in fit.candidates.values())
    q = fit.spec["quantiles_ms"]
    assert len(q) == 21 and q[0] == pytest.approx(x.min(), rel=1e-5) and q[-1] == pytest.approx(x.max(), rel=1e-5)
    assert q[10] == pytest.approx(np.median(x), rel=1e-5)
    assert inside(fit.ci95["p50_ms"], np.median(x))
    Delay.from_spec(fit.spec)


def test_fixed_small_and_nonpositive_samples():
    assert fit_delay([3.0] * 10, 0).spec == {"dist": "fixed", "ms": 3.0}
    small = fit_delay([1.0, 2.0, 3.0], 0)
    assert small.choice == "empirical" and small.spec["quantiles_ms"] == [1.0, 2.0, 3.0]
    negative = fit_delay(np.linspace(-1, 5, 50), 0)
    assert negative.choice == "empirical" and negative.spec["quantiles_ms"][0] == 0.0
    assert any("clipped" in n for n in negative.notes)
    with pytest.raises(FitError):
        fit_delay([np.nan], 0)


def test_gamma_mle_matches_scipy():
    x = np.random.default_rng(9).gamma(0.7, 5.0, size=300)
    shape, scale = _gamma_mle(x)
    ref_shape, _, ref_scale = stats.gamma.fit(x, floc=0)
    assert shape == pytest.approx(ref_shape, rel=1e-4) and scale == pytest.approx(ref_scale, rel=1e-4)


def test_ks_pvalue_is_calibrated_under_the_null():
    """Lilliefors-corrected p-values are ~uniform when the family is right (plain KS would give few
    rejections)."""
    rng = np.random.default_rng(11)
    pvals = np.array([ks_pvalue("lognormal", rng.lognormal(0, 0.5, 60), rng, n_mc=200)[1] for _ in range(200)])
    assert 0.02 <= np.mean(pvals < 0.05) <= 0.10
    assert 0.15 <= np.mean(pvals < 0.25) <= 0.35


def test_ports_differ():
    rng = np.random.default_rng(2)
    same = {f"p{i}": rng.normal(10, 1, 40) for i in range(3)}
    assert not ports_differ(same)[0]
    differ = dict(same, p3=rng.normal(12, 1, 40))
    flag, p = ports_differ(differ)
    assert flag and p < 1e-6
    assert ports_differ({"a": [1.0, 1.0], "b": [1.0, 1.0]}) == (False, 1.0)


def test_ci_coverage_is_near_nominal():
    rng = np.random.default_rng(12)
    hits = total = 0
    for i in range(60):
        fit = fit_delay(rng.gamma(4.0, 0.5, 200), rng_seed=i, n_mc=50, n_boot=300)
        if fit.choice == "gamma":
            total += 1
            hits += inside(fit.ci95["mean_ms"], 2.0)
    assert total >= 45 and 0.85 <= hits / total <= 1.0


def test_bootstrap_resamples_whole_cycles():
    """Ports sharing a cycle's draw: the cycle-cluster CI of the median is wider than the i.i.d. one
    (pseudo-replication) and covers the true median."""
    rng = np.random.default_rng(21)
    shared = rng.lognormal(math.log(45.0), 0.15, size=10)  # one OCS draw per cycle
    x = np.repeat(shared, 8) * np.exp(rng.normal(0, 0.002, 80))
    cycles = np.repeat(np.arange(10), 8)
    clustered, naive = fit_delay(x, 0, cycles=cycles), fit_delay(x, 0)
    assert clustered.choice == naive.choice == "empirical"  # ten distinct values: no family passes KS
    wide, narrow = clustered.ci95["p50_ms"], naive.ci95["p50_ms"]
    assert (wide[1] - wide[0]) > 1.5 * (narrow[1] - narrow[0]) and wide[0] <= 45.0 <= wide[1]


def test_resample_cycles_keeps_cycles_whole():
    from analysis.stats import resample_cycles

    cycles = np.repeat(np.arange(6), [1, 2, 3, 4, 5, 6])
    x = cycles * 100.0 + np.arange(len(cycles))
    for sample in resample_cycles(x, cycles, np.random.default_rng(0), 50):
        drawn = np.floor(sample / 100).astype(int)
        counts = np.bincount(drawn, minlength=6)
        assert all(counts[k] % (k + 1) == 0 for k in range(6))  # each cycle's samples all or none
        assert sum(counts[k] // (k + 1) for k in range(6)) == 6  # as many cycles as the data hold
