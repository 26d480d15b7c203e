"""Spec §5 oracles: generalized mean, gradient, alpha = r + 1, two-job optimal share."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import minimize_scalar

from analysis.fairness import (alpha_from_r, combined_gradient, generalized_mean, generalized_mean_grad,
                               two_job_optimal_share)


def test_special_cases():
    U = np.array([1.0, 2.0, 4.0])
    assert generalized_mean(U, 1) == pytest.approx(7 / 3)
    assert generalized_mean(U, np.inf) == 4.0
    assert generalized_mean(U, 200) == pytest.approx(4.0, rel=0.01)
    assert generalized_mean(np.array([1e300, 1e300]), 3) == pytest.approx(1e300, rel=1e-12)  # stable
    assert alpha_from_r(1) == 2 and alpha_from_r(3) == 4
    np.testing.assert_allclose(generalized_mean_grad(U, 1), [1 / 3] * 3)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), r=st.sampled_from([1.0, 1.5, 2.0, 4.0, 10.0]), J=st.integers(1, 6),
       weighted=st.booleans())
def test_gradient_finite_differences(seed, r, J, weighted):
    rng = np.random.default_rng(seed)
    U = rng.uniform(0.1, 5, J)
    wts = rng.uniform(0.1, 1, J) if weighted else None
    g = generalized_mean_grad(U, r, wts)
    h = 1e-6
    for j in range(J):
        e = np.zeros(J); e[j] = h
        fd = (generalized_mean(U + e, r, wts) - generalized_mean(U - e, r, wts)) / (2 * h)
        assert fd == pytest.approx(g[j], rel=1e-6, abs=1e-9)
    G = rng.normal(size=(J, 3))
    np.testing.assert_allclose(combined_gradient(U, G, r, wts), g @ G)


@pytest.mark.parametrize("r", [1.0, 2.0, 5.0, 50.0])
def test_two_job_oracle(r):
    a, b = 3.0, 1.0
    res = minimize_scalar(lambda x: generalized_mean([a / x, b / (1 - x)], r), bounds=(1e-6, 1 - 1e-6),
                          method="bounded", options={"xatol": 1e-10})
    assert res.x == pytest.approx(two_job_optimal_share(a, b, r), abs=1e-6)
    if r == 1.0:
        assert two_job_optimal_share(a, b, r) == pytest.approx(np.sqrt(a) / (np.sqrt(a) + np.sqrt(b)))
    assert two_job_optimal_share(a, b, np.inf) == pytest.approx(a / (a + b))
    assert two_job_optimal_share(a, b, 1e6) == pytest.approx(a / (a + b), abs=1e-5)
