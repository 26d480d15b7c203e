"""Spec §1 oracles for the smoothed critical path."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from analysis.critical_path import DagPlan, log_num_paths, longest_path, smoothed_critical_path

DIAMOND = dict(num_nodes=4, src=[0, 1, 0, 2], dst=[1, 3, 2, 3], length=[1.0, 2.0, 2.0, 2.0])


def test_diamond_oracle():
    U, mu = smoothed_critical_path(**DIAMOND, beta=1.0)
    assert U == pytest.approx(4 + np.log1p(np.exp(-1)), abs=1e-12)
    assert U == pytest.approx(4.313262, abs=1e-6)
    assert mu[2] == pytest.approx(0.731059, abs=1e-6) and mu[3] == pytest.approx(0.731059, abs=1e-6)
    assert mu[0] == pytest.approx(0.268941, abs=1e-6)
    U100, mu100 = smoothed_critical_path(**DIAMOND, beta=100.0)
    assert U100 == pytest.approx(4.0, abs=1e-3)
    np.testing.assert_allclose(mu100, [0, 0, 1, 1], atol=1e-12)
    Uinf, muinf = smoothed_critical_path(**DIAMOND, beta=np.inf)
    assert Uinf == 4.0
    np.testing.assert_array_equal(muinf, [0, 0, 1, 1])


def random_dag(draw_or_rng, n, p):
    rng = draw_or_rng
    src, dst = [], []
    for v in range(1, n):
        preds = [u for u in range(v) if rng.random() < p] or [int(rng.integers(0, v))]
        src += preds
        dst += [v] * len(preds)
    return np.array(src), np.array(dst)


def enumerate_paths(n, src, dst):
    out = {u: [] for u in range(n)}
    for a, (u, v) in enumerate(zip(src, dst)):
        out[u].append((a, v))
    paths = []

    def rec(u, acc):
        if u == n - 1:
            paths.append(list(acc))
            return
        for a, v in out[u]:
            rec(v, acc + [a])
    rec(0, [])
    return paths


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), p=st.floats(0.1, 0.7), seed=st.integers(0, 10_000),
       beta=st.sampled_from([0.3, 1.0, 5.0, 40.0]))
def test_random_dag_vs_path_enumeration(n, p, seed, beta):
    rng = np.random.default_rng(seed)
    src, dst = random_dag(rng, n, p)
    ell = rng.uniform(0, 3, src.size)
    paths = enumerate_paths(n, src, dst)
    if not paths:
        with pytest.raises(ValueError):
            smoothed_critical_path(n, src, dst, ell, beta)
        return
    L = np.array([ell[pth].sum() for pth in paths])
    U, mu = smoothed_critical_path(n, src, dst, ell, beta)
    from scipy.special import logsumexp
    assert U == pytest.approx(logsumexp(beta * L) / beta, rel=1e-12, abs=1e-12)
    # bounds: max L <= U <= max L + log N / beta
    assert L.max() - 1e-12 <= U <= L.max() + np.log(len(paths)) / beta + 1e-12
    # marginals = Gibbs probability that an arc is on the path
    pg = np.exp(beta * L - logsumexp(beta * L))
    mu_ref = np.zeros(src.size)
    for w, pth in zip(pg, paths):
        mu_ref[pth] += w
    np.testing.assert_allclose(mu, mu_ref, atol=1e-12)
    assert log_num_paths(n, src, dst) == pytest.approx(np.log(len(paths)), abs=1e-12)
    # hard limit = max-plus longest path, one-hot on a longest path
    Uh, muh = longest_path(n, src, dst, ell)
    assert Uh == pytest.approx(L.max(), abs=1e-12)
    assert set(np.unique(muh)) <= {0.0, 1.0}
    assert ell[muh == 1].sum() == pytest.approx(L.max(), abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(3, 12), seed=st.integers(0, 10_000))
def test_marginals_are_finite_difference_gradient(n, seed):
    rng = np.random.default_rng(seed)
    src, dst = random_dag(rng, n, 0.4)
    if not enumerate_paths(n, src, dst):
        return
    ell = rng.uniform(0, 2, src.size)
    beta = 2.0
    plan = DagPlan.build(n, src, dst)
    _, mu = smoothed_critical_path(n, src, dst, ell, beta, plan=plan)
    h = 1e-6
    for a in range(src.size):
        e = np.zeros(src.size)
        e[a] = h
        fd = (smoothed_critical_path(n, src, dst, ell + e, beta, plan=plan)[0]
              - smoothed_critical_path(n, src, dst, ell - e, beta, plan=plan)[0]) / (2 * h)
        assert fd == pytest.approx(mu[a], abs=1e-7)


def test_unit_flow_and_large_beta_stability():
    rng = np.random.default_rng(3)
    src, dst = random_dag(rng, 60, 0.3)
    ell = rng.uniform(0, 1000, src.size)     # beta * l up to 1e7: only the log domain survives this
    U, mu = smoothed_critical_path(60, src, dst, ell, 1e4)
    Uh, _ = longest_path(60, src, dst, ell)
    tol = 1e-12 * Uh
    assert Uh - tol <= U <= Uh + log_num_paths(60, src, dst) / 1e4 + tol
    out = np.bincount(src, mu, 60) - np.bincount(dst, mu, 60)
    assert out[0] == pytest.approx(1.0) and out[-1] == pytest.approx(-1.0)
    np.testing.assert_allclose(out[1:-1], 0, atol=1e-9)


def test_input_validation_and_unreachable_nodes():
    with pytest.raises(ValueError):
        smoothed_critical_path(3, [1], [0], [1.0], 1.0)          # not topological
    with pytest.raises(ValueError):
        smoothed_critical_path(3, [0], [1], [1.0], 1.0)          # sink unreachable
    # node 1 unreachable from source (root other than 0); node 2 a dead end: both must get mu = 0
    U, mu = smoothed_critical_path(5, [1, 0, 0, 1], [3, 2, 4, 4], [5.0, 1.0, 2.0, 9.0], 1.0)
    assert U == pytest.approx(2.0)
    np.testing.assert_allclose(mu, [0, 0, 1, 0])


def test_layered_dag_matches_generic_order():
    """Permuting arc order must not change anything (level grouping is internal)."""
    rng = np.random.default_rng(0)
    src, dst = random_dag(rng, 40, 0.2)
    ell = rng.uniform(0, 1, src.size)
    perm = rng.permutation(src.size)
    U1, mu1 = smoothed_critical_path(40, src, dst, ell, 3.0)
    U2, mu2 = smoothed_critical_path(40, src[perm], dst[perm], ell[perm], 3.0)
    assert U1 == pytest.approx(U2, abs=1e-12)
    np.testing.assert_allclose(mu1[perm], mu2, atol=1e-13)


def _hop_levels_brute(n, src, dst):
    level = [0] * n
    for v in range(n):                                  # nodes are in topological order
        for u, w in zip(src, dst):
            if w == v:
                level[v] = max(level[v], level[u] + 1)
    return level


def _hourglass(rng, widths):
    """Layers of the given widths, each node fed by 1..3 nodes of the previous layer; source and sink."""
    layers, n = [[0]], 1
    for w in widths:
        layers.append(list(range(n, n + w)))
        n += w
    layers.append([n])
    src, dst = [], []
    for prev, cur in zip(layers, layers[1:]):
        for v in cur:
            for u in rng.choice(prev, size=min(len(prev), int(rng.integers(1, 4))), replace=False):
                src.append(int(u)); dst.append(v)
        for u in prev:                                  # every node keeps an out-arc
            if u not in src:
                src.append(u); dst.append(int(rng.choice(cur)))
    return n + 1, np.array(src), np.array(dst)


@pytest.mark.parametrize("seed", range(6))
def test_narrow_runs_and_wide_levels_agree(seed):
    """A DAG that widens and narrows: node-by-node runs and numpy levels give the same values and marginals,
    and the plan's levels equal longest hop distances by brute force."""
    rng = np.random.default_rng(seed)
    widths = [int(w) for w in rng.choice([1, 2, 60, 200], size=12)]
    n, src, dst = _hourglass(rng, widths)
    ell = rng.uniform(0, 1, src.size)
    plans = {k: DagPlan.build(n, src, dst, vector_min_arcs=k) for k in (1, 48, 10**9)}
    assert plans[48].level.tolist() == _hop_levels_brute(n, src.tolist(), dst.tolist())
    for k, plan in plans.items():
        assert plan.level.tolist() == plans[1].level.tolist(), k
    for beta in (0.5, 20.0, np.inf):
        ref_U, ref_mu = smoothed_critical_path(n, src, dst, ell, beta, plan=plans[1])
        for k in (48, 10**9):
            U, mu = smoothed_critical_path(n, src, dst, ell, beta, plan=plans[k])
            assert U == pytest.approx(ref_U, rel=1e-12, abs=1e-12)
            np.testing.assert_allclose(mu, ref_mu, rtol=1e-9, atol=1e-12)


def test_deep_chain_levels_and_path():
    """10^4 levels of a two-wide ladder: levels are exact and the hard path is the closed-form sum."""
    depth = 10_000
    n = 2 + 2 * depth
    src, dst = [0, 0], [1, 2]
    for k in range(depth - 1):
        a, b = 1 + 2 * k, 2 + 2 * k
        src += [a, a, b, b]
        dst += [a + 2, b + 2, a + 2, b + 2]
    src += [n - 3, n - 2]
    dst += [n - 1, n - 1]
    src, dst = np.array(src), np.array(dst)
    ell = np.where(src % 2 == 1, 2.0, 1.0)             # arcs out of odd nodes are longer
    plan = DagPlan.build(n, src, dst)
    assert plan.level[n - 1] == depth + 1 and plan.level[n - 2] == depth
    U, mu = longest_path(n, src, dst, ell, plan=plan)
    assert U == 1.0 + 2.0 * depth                       # source arc, then always from an odd node
    assert mu.sum() == depth + 1


def _dp_oracle(n, src, dst, ell, beta):
    """The spec's pseudo-code, literally: node by node in topological order, Python floats, scipy's logsumexp
    (max for beta = inf); returns (U, mu), mu from alpha and gamma (soft) or None (hard)."""
    from scipy.special import logsumexp

    pred = {v: [] for v in range(n)}
    succ = {u: [] for u in range(n)}
    for a, (u, v) in enumerate(zip(src, dst)):
        pred[v].append(a)
        succ[u].append(a)
    hard = np.isinf(beta)
    w = ell if hard else beta * ell
    reduce = (lambda xs: max(xs)) if hard else (lambda xs: float(logsumexp(xs)))
    alpha = [-np.inf] * n
    alpha[0] = 0.0
    for v in range(1, n):
        if pred[v]:
            alpha[v] = reduce([alpha[src[a]] + w[a] for a in pred[v]])
    if hard:
        return alpha[n - 1], None
    gamma = [-np.inf] * n
    gamma[n - 1] = 0.0
    for u in range(n - 2, -1, -1):
        if succ[u]:
            gamma[u] = reduce([w[a] + gamma[dst[a]] for a in succ[u]])
    with np.errstate(invalid="ignore"):
        mu = np.exp([alpha[u] + w[a] + gamma[v] - alpha[n - 1] for a, (u, v) in enumerate(zip(src, dst))])
    return alpha[n - 1] / beta, np.nan_to_num(mu)


@pytest.mark.parametrize("seed", range(4))
def test_deep_and_wide_dags_match_the_node_by_node_recursion(seed):
    """Random DAGs too big to enumerate (~300 nodes), deep stretches with arcs that skip levels mixed with wide
    levels, so node-by-node runs read tails inside and outside themselves: the plan's sweeps equal the spec's
    literal recursion, for values and marginals, whichever way the levels are split."""
    rng = np.random.default_rng(100 + seed)
    n, src, dst = _hourglass(rng, [int(w) for w in rng.choice([1, 2, 3, 80], size=40)])
    skip_u = rng.integers(0, n - 2, size=n // 4)                  # long arcs forward, across several levels
    skip_v = np.minimum(skip_u + rng.integers(2, 40, size=skip_u.size), n - 2)
    keep = skip_v > skip_u
    src, dst = np.r_[src, skip_u[keep]], np.r_[dst, skip_v[keep]]
    ell = rng.uniform(0, 1, src.size)
    for beta in (0.7, 30.0, np.inf):
        ref_U, ref_mu = _dp_oracle(n, src.tolist(), dst.tolist(), ell, beta)
        for k in (48, 10**9):
            U, mu = smoothed_critical_path(n, src, dst, ell, beta, plan=DagPlan.build(n, src, dst, vector_min_arcs=k))
            assert U == pytest.approx(ref_U, rel=1e-12, abs=1e-12)
            if ref_mu is not None:
                np.testing.assert_allclose(mu, ref_mu, rtol=1e-9, atol=1e-12)
            else:
                assert ell[mu == 1].sum() == pytest.approx(ref_U, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_chunked_runs_match_the_node_by_node_recursion(seed, monkeypatch):
    """Narrow runs swept as chained chunk transfer matrices (what a 10^6-arc deep DAG uses), forced onto small
    random DAGs with level-skipping arcs and short chunks, so boundaries fall inside the run and outside it:
    values, marginals and levels equal the spec's literal recursion and brute-force hop distances."""
    from analysis import critical_path as cp

    monkeypatch.setattr(cp._Chunks, "MIN_NODES", 1)
    monkeypatch.setattr(cp._Chunks, "CHUNK", (3 + seed, 7 + seed))
    monkeypatch.setattr(cp._Chunks, "MAX_WORK", 10**6)
    rng = np.random.default_rng(200 + seed)
    n, src, dst = _hourglass(rng, [int(w) for w in rng.choice([1, 2, 3, 30], size=30)])
    skip_u = rng.integers(0, n - 2, size=n // 4)
    skip_v = np.minimum(skip_u + rng.integers(2, 25, size=skip_u.size), n - 2)
    keep = skip_v > skip_u
    src, dst = np.r_[src, skip_u[keep]], np.r_[dst, skip_v[keep]]
    ell = rng.uniform(0, 1, src.size)
    plan = DagPlan.build(n, src, dst, vector_min_arcs=10**9)        # every level narrow: chunked throughout
    assert any(isinstance(b, cp._Chunks) for b in plan.fwd_blocks + plan.bwd_blocks)
    assert plan.level.tolist() == _hop_levels_brute(n, src.tolist(), dst.tolist())
    lv_chunked = cp._levels(n, src, dst)             # its narrow rest finished by a chunked (max, +) sweep
    assert lv_chunked.tolist() == plan.level.tolist()
    for beta in (0.7, 30.0, np.inf):
        ref_U, ref_mu = _dp_oracle(n, src.tolist(), dst.tolist(), ell, beta)
        U, mu = smoothed_critical_path(n, src, dst, ell, beta, plan=plan)
        assert U == pytest.approx(ref_U, rel=1e-12, abs=1e-12)
        if ref_mu is not None:
            np.testing.assert_allclose(mu, ref_mu, rtol=1e-9, atol=1e-12)
        else:
            assert ell[mu == 1].sum() == pytest.approx(ref_U, rel=1e-12)
