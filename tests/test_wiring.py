"""Spec §2 oracles: KL projection (KKT, K4 Sinkhorn), entropic proximal gradient, MILP, rounding."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import minimize

from analysis.wiring import (WiringProblem, brute_force_wiring, complete_graph_edges, exact_wiring_milp,
                             kl_divergence, kl_project, optimize_wiring, round_wiring)


def chains_problem(n, chains, degree, b_ocs=1.0, b_eps=0.1, edges=None):
    """Parallel compute -> comm chains from source to sink: chains = [((i, j), bytes, compute_s), ...]."""
    edges = complete_graph_edges(n) if edges is None else np.asarray(edges)
    eidx = {tuple(e): k for k, e in enumerate(edges)}
    N = 2 + len(chains)
    src, dst, fl, by, ae = [], [], [], [], []
    for c, (pair, b, comp) in enumerate(chains):
        m = 1 + c
        src += [0, m]; dst += [m, N - 1]; fl += [comp, 0.0]; by += [0.0, b]; ae += [-1, eidx[tuple(sorted(pair))]]
    return WiringProblem(N, src, dst, fl, by, ae, edges, np.broadcast_to(degree, (n,)).astype(float),
                         b_ocs=b_ocs, b_eps=b_eps)


WORKED = [((0, 1), 4, 1), ((2, 3), 4, 1), ((0, 2), 1, 0.5), ((0, 3), 2, 0.5)]


def test_projection_k4_sinkhorn_oracle():
    edges = complete_graph_edges(4)     # (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    d = np.array([1.5, 1, 1, 1])
    M = d.sum() / 2
    for method in ("coordinate", "parallel", "newton"):
        logw, info = kl_project(np.zeros(6), edges, d / M, method=method, return_info=True)
        x = M * np.exp(logw)
        np.testing.assert_allclose(x, [0.5, 0.5, 0.5, 0.25, 0.25, 0.25], atol=1e-8)
        np.testing.assert_allclose(np.exp(-(info["lam"] - info["lam"][0])), [1, .5, .5, .5], atol=1e-8)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(3, 7), seed=st.integers(0, 10_000), slack=st.sampled_from([0.0, 0.2, 1.0]))
def test_projection_kkt_residuals(n, seed, slack):
    rng = np.random.default_rng(seed)
    edges = complete_graph_edges(n)
    log_y = rng.normal(0, 2, len(edges))
    E = len(edges)
    w_in = rng.dirichlet(np.ones(E))                   # budgets with a strictly positive feasible point
    Bw = np.bincount(edges[:, 0], w_in, n) + np.bincount(edges[:, 1], w_in, n)
    b = Bw * (1 + slack * rng.random(n))              # slack = 0: budgets necessarily tight (equality)
    method = "newton" if slack == 0 else "coordinate"   # coordinate ascent on K4 equality: oracle test
    logw, info = kl_project(log_y, edges, b, tol=1e-12, method=method, return_info=True)
    for k in ("stationarity", "primal", "dual", "slackness"):
        assert info[k] < 1e-8, (k, info[k])
    y = np.exp(log_y)
    f = lambda w: np.sum(w * np.log(np.maximum(w, 1e-300) / y) - w + y)
    w = np.exp(logw)
    for _ in range(5):   # any feasible perturbation along the face does not decrease KL
        z = np.exp(logw + 0.05 * rng.normal(size=E))
        zp = np.exp(kl_project(np.log(z), edges, b, tol=1e-12, method=method))
        assert f(zp) >= f(w) - 1e-9


def test_worked_example_milp_equals_brute_force():
    p = chains_problem(4, WORKED, 2.0)
    T_bf, x_bf = brute_force_wiring(p)
    r = exact_wiring_milp(p)
    assert T_bf == pytest.approx(10.5) and r["makespan"] == pytest.approx(10.5)
    # x = {01: 1, 03: 1, 23: 1}
    np.testing.assert_array_equal(r["x"], [1, 0, 1, 0, 0, 1])


def test_worked_example_relaxation_monotone_in_b1_and_linear():
    p = chains_problem(4, WORKED, 2.0)
    res = {b1: optimize_wiring(p, b1, 30.0, max_iter=3000) for b1 in (0.3, 1.0, 10.0)}
    U = [res[b].U[-1] for b in (0.3, 1.0, 10.0)]
    KL = [res[b].KL[-1] for b in (0.3, 1.0, 10.0)]
    np.testing.assert_allclose(U, [4.10, 3.894, 3.893], atol=2e-3)
    assert KL[0] == pytest.approx(0.155, abs=2e-3) and KL[2] == pytest.approx(0.242, abs=2e-3)
    assert U[0] >= U[1] >= U[2] - 1e-9 and KL[0] <= KL[1] <= KL[2] + 1e-9
    for r in res.values():
        assert r.converged
        F = r.objective
        assert np.all(np.diff(F) <= 1e-10 * abs(F[0]))           # monotone descent
        gap = F - F[-1]
        k = np.flatnonzero(gap > 1e-9)
        if k.size > 10:   # linear: gaps fall geometrically (fitted rate < 1)
            slope = np.polyfit(k, np.log(gap[k]), 1)[0]
            assert slope < -0.01


def test_relaxation_matches_generic_solver():
    p = chains_problem(4, WORKED, 2.0)
    b1, beta = 1.0, 30.0
    r = optimize_wiring(p, b1, beta, max_iter=3000)
    E = p.num_edges
    B = np.zeros((4, E)); B[p.edges[:, 0], np.arange(E)] = 1; B[p.edges[:, 1], np.arange(E)] = 1

    def F(w):
        w = np.maximum(w, 1e-14)
        u, g, _ = p.U(w, beta)
        return u + kl_divergence(w, p.prior) / b1, g + (np.log(w / p.prior) + 1) / b1
    ref = minimize(F, p.prior, jac=True, method="SLSQP", bounds=[(1e-12, 1)] * E,
                   constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1},
                                {"type": "ineq", "fun": lambda w: p.budget - B @ w}],
                   options={"ftol": 1e-14, "maxiter": 1000})
    assert r.objective[-1] <= ref.fun + 1e-9
    assert r.objective[-1] == pytest.approx(ref.fun, rel=1e-6)


def test_symmetry_principle_uniform_traffic_returns_prior():
    n = 5
    chains = [((i, j), 3.0, 0.5) for i in range(n) for j in range(i + 1, n)]
    p = chains_problem(n, chains, 2.0)
    rng = np.random.default_rng(0)
    for b1 in (0.1, 10.0, 1e3):
        r = optimize_wiring(p, b1, 20.0)
        np.testing.assert_allclose(r.w, p.prior, atol=1e-9)
        w0 = np.exp(kl_project(np.log(p.prior) + 0.3 * rng.normal(size=p.num_edges), p.edges, p.budget))
        r2 = optimize_wiring(p, b1, 20.0, w0=w0, max_iter=5000)
        np.testing.assert_allclose(r2.w, p.prior, atol=1e-5)


def test_adaptation_bound_jeffreys():
    """J(w1*, w2*) <= b1 ||grad U1(w2*) - grad U2(w2*)||_inf ||w1* - w2*||_1 (from the two VIs)."""
    p1 = chains_problem(4, WORKED, 2.0)
    p2 = chains_problem(4, [((0, 1), 1, 1), ((2, 3), 2, 1), ((0, 2), 4, 0.5), ((1, 3), 3, 0.5)], 2.0)
    for b1 in (0.3, 1.0, 3.0):
        w1 = optimize_wiring(p1, b1, 10.0, max_iter=5000).w
        w2 = optimize_wiring(p2, b1, 10.0, max_iter=5000).w
        J = np.sum((w1 - w2) * (np.log(w1) - np.log(w2)))
        G = np.max(np.abs(p1.U(w2, 10.0)[1] - p2.U(w2, 10.0)[1]))
        l1 = np.abs(w1 - w2).sum()
        assert J <= b1 * G * l1 * (1 + 1e-6) + 1e-10
        assert l1 <= b1 * G * (1 + 1e-6) + 1e-10          # Pinsker: J >= ||.||_1^2


def test_gradient_matches_finite_differences():
    p = chains_problem(4, WORKED, 2.0)
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.ones(p.num_edges))
    _, g, _ = p.U(w, 5.0)
    h = 1e-7
    for e in range(p.num_edges):
        d = np.zeros(p.num_edges); d[e] = h
        fd = (p.U(w + d, 5.0)[0] - p.U(w - d, 5.0)[0]) / (2 * h)
        assert fd == pytest.approx(g[e], rel=1e-5, abs=1e-7)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 4), k=st.integers(2, 4), deg=st.integers(1, 2))
def test_milp_equals_brute_force_on_tiny_instances(seed, n, k, deg):
    rng = np.random.default_rng(seed)
    chains = []
    for _ in range(k):
        i, j = sorted(rng.choice(n, 2, replace=False))
        chains.append(((int(i), int(j)), float(rng.uniform(0.5, 5)), float(rng.uniform(0, 2))))
    p = chains_problem(n, chains, float(deg), b_eps=float(rng.uniform(0.05, 0.5)))
    T_bf, _ = brute_force_wiring(p)
    r = exact_wiring_milp(p)
    assert r["makespan"] == pytest.approx(T_bf, rel=1e-7)
    # b1 -> inf relaxation minus log(N_paths)/beta lower-bounds the integer optimum, provided the
    # integer optimum extends to a point of M P (P with M = sum(d)/2 is the fractional *perfect*
    # b-matching polytope; lengths decrease in w, so a dominating point is at least as fast).
    if _extends_to_perfect(p, r["x"]):
        beta = 50.0
        rel = optimize_wiring(p, np.inf, beta, max_iter=3000)  # converged: 200 stopped short on some seeds
        assert rel.U[-1] - np.log(k) / beta <= T_bf + 1e-9


def _extends_to_perfect(p, x):
    from scipy.optimize import linprog
    E, n = p.num_edges, len(p.degree)
    B = np.zeros((n, E)); B[p.edges[:, 0], np.arange(E)] = 1; B[p.edges[:, 1], np.arange(E)] = 1
    res = linprog(np.zeros(E), A_eq=B, b_eq=p.degree, bounds=[(xe, None) for xe in x])
    return res.status == 0


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 4))
def test_rounding_respects_budgets_and_milp_is_l1_optimal(seed, n):
    rng = np.random.default_rng(seed)
    edges = complete_graph_edges(n)
    d = rng.integers(1, 3, n).astype(float)
    M = d.sum() / 2
    z = rng.dirichlet(np.ones(len(edges)) * 0.5)          # a fractional wiring within the budgets
    load = np.bincount(edges[:, 0], z, n) + np.bincount(edges[:, 1], z, n)
    w = z * np.min(d / load) / M
    for method in ("largest_remainder", "milp"):
        x = round_wiring(w, edges, d, method=method)
        load = np.bincount(edges[:, 0], x, n) + np.bincount(edges[:, 1], x, n)
        assert np.all(load <= d + 1e-9) and x.sum() <= M + 1e-9 and np.all(x >= 0)
    # MILP rounding is the L1-closest integer wiring (before filling leftover ports)
    import itertools
    best = np.inf
    for combo in itertools.product(*[range(int(min(d[i], d[j])) + 1) for i, j in edges]):
        x = np.array(combo, float)
        load = np.bincount(edges[:, 0], x, n) + np.bincount(edges[:, 1], x, n)
        if np.all(load <= d) and x.sum() <= M:
            best = min(best, np.abs(x - M * w).sum())
    xm = round_wiring(w, edges, d, method="milp", fill=False)
    assert np.abs(xm - M * w).sum() == pytest.approx(best, abs=1e-6)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), nb=st.sampled_from(["all", "critical"]))
def test_polish_never_worse_and_respects_budgets(seed, nb):
    from analysis.wiring import polish_wiring
    rng = np.random.default_rng(seed)
    n = 5
    chains = []
    for _ in range(6):
        i, j = sorted(rng.choice(n, 2, replace=False))
        chains.append(((int(i), int(j)), float(rng.uniform(0.5, 5)), float(rng.uniform(0, 1))))
    p = chains_problem(n, chains, 2.0, b_eps=0.2)
    x0 = round_wiring(p.prior, p.edges, p.degree)
    x, info = polish_wiring(p, x0, neighborhood=nb)
    load = np.bincount(p.edges[:, 0], x, n) + np.bincount(p.edges[:, 1], x, n)
    assert np.all(load <= p.degree) and np.all(x >= 0)
    assert info["makespan"] <= p.makespan(x0) + 1e-12
    assert info["makespan"] >= exact_wiring_milp(p)["makespan"] - 1e-9


@pytest.mark.parametrize("method", ["coordinate", "parallel", "newton"])
def test_kl_project_raises_on_an_empty_polytope(method):
    """A star 0-1, 0-2: node 0 carries every edge, so its budget must hold all of 1'w = 1."""
    from analysis.wiring import EmptyPolytopeError

    edges = np.array([[0, 1], [0, 2]])
    with pytest.raises(EmptyPolytopeError):  # equality: B w = (0.5, .75, .75) has no solution
        kl_project(np.zeros(2), edges, np.array([0.5, 0.75, 0.75]), method=method, max_sweeps=100)
    if method == "coordinate":
        with pytest.raises(EmptyPolytopeError):  # inequality: node 0 can take only 0.5 of the mass
            kl_project(np.zeros(2), edges, np.array([0.5, 1.0, 1.0]), max_sweeps=100)
        with pytest.raises(EmptyPolytopeError, match="sum to 0.9"):
            kl_project(np.zeros(2), edges, np.array([0.3, 0.3, 0.3]))
        w = np.exp(kl_project(np.zeros(2), edges, np.array([1.0, 1.0, 1.0])))  # feasible: projected
        assert w == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("method", ["coordinate", "parallel", "newton"])
def test_kl_project_says_when_it_stops_short(method):
    """A projection cut off before its tolerance warns with its primal violation and reports converged =
    False; the same projection given its sweeps converges silently, its violation within tolerance."""
    import warnings

    from analysis.wiring import ProjectionNotConverged

    n = 6
    edges = complete_graph_edges(n)
    log_y = np.random.default_rng(3).normal(0, 1.5, len(edges))  # away from the polytope
    b = np.full(n, 2.0 / n)
    with pytest.warns(ProjectionNotConverged, match=r"stopped after 1 sweeps .* primal violation"):
        _, short = kl_project(log_y, edges, b, method=method, max_sweeps=1, tol=1e-12, return_info=True)
    assert short["converged"] is False and short["primal"] > 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProjectionNotConverged)
        full_w, full = kl_project(log_y, edges, b, method=method, tol=1e-10, return_info=True)
    assert full["converged"] is True and full["primal"] < 1e-8
    # without residuals (the optimizer's inner loop): the same point; a cut-off one still has and warns them
    lean_w, lean = kl_project(log_y, edges, b, method=method, tol=1e-10, return_info=True, residuals=False)
    np.testing.assert_array_equal(lean_w, full_w)
    assert lean["converged"] is True and "primal" not in lean
    with pytest.warns(ProjectionNotConverged):
        _, short2 = kl_project(log_y, edges, b, method=method, max_sweeps=1, tol=1e-12, return_info=True,
                               residuals=False)
    assert short2["primal"] == short["primal"]


def test_solve_wiring_takes_the_exact_milp_on_small_regions():
    from analysis.wiring import EXACT_MAX_ENDPOINTS, solve_wiring

    rng = np.random.default_rng(4)
    chains = []
    for _ in range(6):
        i, j = sorted(rng.choice(5, 2, replace=False))
        chains.append(((int(i), int(j)), float(rng.uniform(0.5, 5)), float(rng.uniform(0, 1))))
    p = chains_problem(5, chains, 2.0, b_eps=0.2)
    assert len(p.degree) <= EXACT_MAX_ENDPOINTS
    x, info = solve_wiring(p)
    assert info["method"] == "milp" and info["makespan"] == pytest.approx(brute_force_wiring(p)[0], rel=1e-7)
    x_pipe, pipe = solve_wiring(p, exact_max_endpoints=4)  # one endpoint too many for the MILP: the pipeline
    load = np.bincount(p.edges[:, 0], x_pipe, 5) + np.bincount(p.edges[:, 1], x_pipe, 5)
    assert pipe["method"] == "pipeline" and np.all(load <= p.degree) and pipe["makespan"] >= info["makespan"] - 1e-12
