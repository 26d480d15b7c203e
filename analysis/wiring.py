"""Wiring free energy, KL projection, entropic proximal gradient, exact MILP, rounding (spec §2).

A wiring is w in P = {w >= 0, 1'w = 1, B w <= d/M} over candidate circuits E (unordered endpoint
pairs); x = M w are circuit counts. Communication arcs of the iteration DAG take
    l_a(w) = fixed_a + bytes_a / (B_eps + M w_e(a) B_ocs)      (convex, decreasing; EPS keeps it finite)
and the objective is F(w) = U_beta(l(w)) + KL(w || q) / b1 (b1 in 1/s).
"""
from __future__ import annotations

import itertools
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from .critical_path import DagPlan, smoothed_critical_path

__all__ = ["WiringProblem", "WiringResult", "kl_project", "kkt_residuals", "optimize_wiring",
           "exact_wiring_milp", "brute_force_wiring", "round_wiring", "complete_graph_edges",
           "uniform_prior", "kl_divergence", "polish_wiring", "ProjectionNotConverged", "solve_wiring",
           "EXACT_MAX_ENDPOINTS"]


class ProjectionNotConverged(RuntimeWarning):
    """`kl_project` used all its sweeps without reaching its tolerance: the point returned is off the
    polytope by the primal violation the warning (and `return_info`'s "primal") states."""


def complete_graph_edges(n: int) -> np.ndarray:
    """All unordered pairs (i < j) of n endpoints, shape (n(n-1)/2, 2)."""
    i, j = np.triu_indices(n, k=1)
    return np.stack([i, j], axis=1).astype(np.int64)


def uniform_prior(num_edges: int) -> np.ndarray:
    return np.full(num_edges, 1.0 / num_edges)


def kl_divergence(w, q) -> float:
    """KL(w || q) = sum w log(w/q) with 0 log 0 = 0."""
    w = np.asarray(w, float)
    q = np.asarray(q, float)
    pos = w > 0
    return float(np.sum(w[pos] * (np.log(w[pos]) - np.log(q[pos]))))


# ---------------------------------------------------------------------------------------------
# §2.4 KL projection onto P with |V| duals


def _incidence(edges: np.ndarray, n: int):
    inc = [[] for _ in range(n)]
    for e, (i, j) in enumerate(edges):
        inc[i].append(e)
        inc[j].append(e)
    return [np.asarray(v, dtype=np.int64) for v in inc]


def kl_project(log_y, edges, degree_budget, *, equality: bool | None = None, lam0=None, tol: float = 1e-10,
               max_sweeps: int = 10_000, method: str = "coordinate", return_info: bool = False,
               residuals: bool = True):
    """argmin_{w in P} KL(w || y) with P = {w >= 0, 1'w = 1, B w <= b}, b = `degree_budget` (= d/M).

    Dual coordinate ascent on the |V| node duals lambda >= 0 (plus nu for 1'w = 1), each step exact:
        w_e = y_e exp(-nu - lambda_i - lambda_j),  lambda_i <- max(0, lambda_i + log (B w)_i - log b_i).
    Works in log w throughout. If sum(b) == 2 the budgets are necessarily tight (sum_i (Bw)_i = 2 1'w)
    and the problem is symmetric Sinkhorn (`equality`; lambda free, nu redundant). `method="parallel"`
    updates all duals at once with geometric-mean damping (Knight 2008); `method="newton"` minimises the
    same |V|-dim dual by Newton steps (quadratic convergence; used by `optimize_wiring`). Both: equality only.
    Returns log w (and with `return_info` a dict: lam, nu, sweeps, converged, kkt residuals). A projection
    that uses all `max_sweeps` without reaching `tol` warns (`ProjectionNotConverged`, with its primal
    violation) and says converged = False. `residuals=False` leaves the KKT residuals out of the info of a
    converged projection (an inner loop's saving; a stalled one always has them).
    Raises EmptyPolytopeError when P (on the support of y) is empty: no point could satisfy the budgets.
    """
    log_y = np.asarray(log_y, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.int64)
    b = np.asarray(degree_budget, dtype=np.float64)
    n = b.size
    if np.any(b <= 0):
        raise ValueError("degree budgets must be positive")
    if equality is None:
        equality = abs(b.sum() - 2.0) <= 1e-9
    if b.sum() < 2.0 - 1e-9:  # every edge loads two endpoints: sum_i (B w)_i = 2 1'w = 2
        raise EmptyPolytopeError(f"degree budgets sum to {b.sum():.6g} < 2: no w with 1'w = 1 fits them")
    log_b = np.log(b)
    ei, ej = edges[:, 0], edges[:, 1]
    lam = np.zeros(n) if lam0 is None else np.array(lam0, dtype=np.float64)
    if not equality:
        lam = np.maximum(lam, 0.0)
    nu = 0.0
    logw = log_y - lam[ei] - lam[ej]
    if not equality:
        nu = logsumexp(logw)
        logw = logw - nu
    sweeps = 0
    converged = False
    if method == "newton":
        if not equality:
            raise ValueError("method='newton' is for equality budgets only")
        if lam0 is None:                      # shift so that the initial log w <= 0
            lam = np.full(n, 0.5 * float(np.max(log_y)))
        logw, lam, sweeps, converged = _newton_equality(log_y, ei, ej, b, lam, tol, max_sweeps)
    elif method == "parallel":
        if not equality:
            raise ValueError("method='parallel' is for equality budgets only")
        for sweeps in range(1, max_sweeps + 1):
            s = _node_lse(logw, ei, ej, n)
            r = s - log_b
            if np.max(np.abs(r)) < tol:
                converged = True
                break
            step = 0.5 * r
            lam += step
            logw -= step[ei] + step[ej]
    else:
        inc = _incidence(edges, n)
        for sweeps in range(1, max_sweeps + 1):
            for i in range(n):
                ii = inc[i]
                if ii.size == 0:
                    continue
                s_i = logsumexp(logw[ii])
                new = lam[i] + s_i - log_b[i]
                if not equality:
                    new = max(0.0, new)
                delta = new - lam[i]
                if delta != 0.0:
                    lam[i] = new
                    logw[ii] -= delta
            if not equality:
                dn = logsumexp(logw)
                nu += dn
                logw -= dn
            s = _node_lse(logw, ei, ej, n)
            if equality:
                viol = np.max(np.abs(s - log_b))
            else:
                viol = max(np.max(np.maximum(s - log_b, 0.0)), abs(logsumexp(logw)),
                           np.max(np.where(lam > 0, np.abs(s - log_b), 0.0)))
            if viol < tol:
                converged = True
                break
    _check_feasible(log_y, logw, edges, b, equality, max(tol, 1e-6))
    kkt = kkt_residuals(log_y, edges, b, logw, lam, nu, equality=equality) if residuals or not converged else {}
    if not converged:
        warnings.warn(f"kl_project(method={method!r}) stopped after {sweeps} sweeps without reaching tol {tol:g}: "
                      f"primal violation {kkt['primal']:.3g}", ProjectionNotConverged, stacklevel=2)
    if not return_info:
        return logw
    return logw, {"lam": lam, "nu": nu, "sweeps": sweeps, "equality": equality, "converged": converged, **kkt}


class EmptyPolytopeError(ValueError):
    """The budget polytope {w >= 0, 1'w = 1, B w <= b (or = b)} has no point on the candidate edges."""


def _check_feasible(log_y, logw, edges, b, equality: bool, tol: float) -> None:
    """Raise EmptyPolytopeError if the projection ended outside P because P is empty (an LP says so)."""
    n = b.size
    s = _node_lse(logw, edges[:, 0], edges[:, 1], n) if np.all(np.isfinite(logw) | (logw == -np.inf)) else None
    if s is not None:
        viol = np.abs(s - np.log(b)) if equality else np.maximum(s - np.log(b), 0.0)
        top = np.max(logw, initial=-np.inf)
        total = top + np.log(np.sum(np.exp(logw - top))) if np.isfinite(top) else -np.inf   # log 1'w
        if np.max(viol, initial=0.0) < tol and abs(total) < tol:
            return
    from scipy.optimize import linprog

    support = np.flatnonzero(np.isfinite(log_y))
    m = support.size
    if m:
        B = np.zeros((n, m))
        B[edges[support, 0], np.arange(m)] = 1.0
        B[edges[support, 1], np.arange(m)] = 1.0
        rows = dict(A_eq=np.vstack([np.ones((1, m)), B]), b_eq=np.r_[1.0, b]) if equality else \
            dict(A_ub=B, b_ub=b, A_eq=np.ones((1, m)), b_eq=[1.0])
        if linprog(np.zeros(m), bounds=(0, None), method="highs", **rows).status != 2:  # 2: infeasible
            return  # feasible: a slow convergence, reported by the KKT residuals, not an empty polytope
    raise EmptyPolytopeError(f"the budget polytope is empty on the {m} candidate edges: no w >= 0 with "
                             f"1'w = 1 and B w {'=' if equality else '<='} b (b = {np.round(b, 6).tolist()})")


def _newton_equality(log_y, ei, ej, b, lam, tol, max_iter):
    """Newton's method on the |V|-dim dual phi(lam) = sum_e y_e exp(-lam_i - lam_j) + b'lam (convex;
    its minimiser gives B w = b). Hessian = diag(B w) + W (W_ij = w_ij), solved densely (O(n^3));
    Armijo backtracking on phi. Converges quadratically, also when the solution nears the boundary."""
    n = b.size
    log_b = np.log(b)

    def state(lam):
        logw = log_y - lam[ei] - lam[ej]
        w = np.exp(logw)
        bw = np.bincount(ei, w, n) + np.bincount(ej, w, n)
        return logw, w, bw, float(w.sum() + b @ lam)

    logw, w, bw, phi = state(lam)
    it = 0
    for it in range(1, max_iter + 1):
        with np.errstate(divide="ignore"):
            r = np.log(bw) - log_b
        if np.max(np.abs(r)) < tol:
            return logw, lam, it, True
        H = np.zeros((n, n))
        np.add.at(H, (ei, ej), w)
        H += H.T
        H[np.diag_indices(n)] += bw
        g = b - bw
        try:
            step = np.linalg.solve(H + 1e-15 * np.trace(H) * np.eye(n), g)
        except np.linalg.LinAlgError:  # pragma: no cover
            step = np.linalg.lstsq(H, g, rcond=None)[0]
        t = 1.0
        dec = float(g @ step)
        rnorm = float(np.max(np.abs(r)))
        for _ in range(60):
            cand = lam - t * step
            c_logw, c_w, c_bw, c_phi = state(cand)
            if np.isfinite(c_phi) and c_phi <= phi - 1e-4 * t * dec:
                break
            with np.errstate(divide="ignore"):  # near the optimum phi is flat to rounding: use the residual
                if np.max(np.abs(np.log(c_bw) - log_b)) < 0.5 * rnorm:
                    break
            t *= 0.5
        else:  # no progress possible at machine precision: as close as doubles get
            return logw, lam, it, True
        lam, logw, w, bw, phi = cand, c_logw, c_w, c_bw, c_phi
    return logw, lam, it, False


def _node_lse(logw, ei, ej, n):
    """log (B w)_i for every node."""
    m = np.max(logw) if logw.size else 0.0
    ew = np.exp(logw - m)
    s = np.bincount(ei, weights=ew, minlength=n) + np.bincount(ej, weights=ew, minlength=n)
    with np.errstate(divide="ignore"):
        return np.log(s) + m


def kkt_residuals(log_y, edges, b, log_w, lam, nu, *, equality: bool = False) -> dict:
    """KKT residuals of the projection: stationarity, primal/dual feasibility, complementary slackness."""
    edges = np.asarray(edges)
    ei, ej = edges[:, 0], edges[:, 1]
    w = np.exp(log_w)
    bw = np.bincount(ei, weights=w, minlength=len(b)) + np.bincount(ej, weights=w, minlength=len(b))
    stat = np.max(np.abs(log_w - log_y + lam[ei] + lam[ej] + nu))
    primal = max(float(np.max(np.abs(bw - b) if equality else np.maximum(bw - b, 0.0))), abs(w.sum() - 1.0))
    dual = 0.0 if equality else float(np.max(np.maximum(-lam, 0.0)))
    slack = 0.0 if equality else float(np.max(np.abs(lam * (bw - b))))
    return {"stationarity": float(stat), "primal": float(primal), "dual": dual, "slackness": slack}


# ---------------------------------------------------------------------------------------------
# Problem: DAG + circuit-dependent arc lengths


@dataclass
class WiringProblem:
    """Iteration DAG whose communication arcs depend on the wiring.

    `arc_edge[a]` = index into `edges` of the circuit serving arc a, or -1 for a fixed arc.
    Comm arcs take fixed_length + arc_bytes / (b_eps + x_e b_ocs) with x = M w circuits.
    """

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    fixed_length: np.ndarray
    arc_bytes: np.ndarray
    arc_edge: np.ndarray
    edges: np.ndarray
    degree: np.ndarray
    b_ocs: float = 1.0
    b_eps: float | np.ndarray = 0.1
    num_circuits: float | None = None
    prior: np.ndarray | None = None
    plan: DagPlan = field(default=None, repr=False)

    def __post_init__(self):
        self.src = np.asarray(self.src, dtype=np.int64)
        self.dst = np.asarray(self.dst, dtype=np.int64)
        self.fixed_length = np.asarray(self.fixed_length, dtype=np.float64)
        self.arc_bytes = np.asarray(self.arc_bytes, dtype=np.float64)
        self.arc_edge = np.asarray(self.arc_edge, dtype=np.int64)
        self.edges = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        self.degree = np.asarray(self.degree, dtype=np.float64)
        if self.num_circuits is None:
            self.num_circuits = 0.5 * float(self.degree.sum())
        if self.prior is None:
            self.prior = uniform_prior(len(self.edges))
        self.prior = np.asarray(self.prior, dtype=np.float64)
        if self.plan is None:
            self.plan = DagPlan.build(self.num_nodes, self.src, self.dst)
        self._comm = np.flatnonzero(self.arc_edge >= 0)
        be = np.broadcast_to(np.asarray(self.b_eps, dtype=np.float64), self.src.shape)
        self._beps_comm = be[self._comm]

    @property
    def budget(self) -> np.ndarray:
        """Normalised degree budgets b = d / M of the polytope P."""
        return self.degree / self.num_circuits

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    def lengths(self, x) -> np.ndarray:
        """Arc lengths (s) for circuit counts x per edge (integer or fractional)."""
        x = np.asarray(x, dtype=np.float64)
        ell = self.fixed_length.copy()
        c = self._comm
        den = self._beps_comm + x[self.arc_edge[c]] * self.b_ocs
        with np.errstate(divide="ignore"):
            ell[c] += self.arc_bytes[c] / den
        return ell

    def makespan(self, x) -> float:
        """Hard critical path (s) for integer circuit counts x."""
        v, _ = smoothed_critical_path(self.num_nodes, self.src, self.dst, self.lengths(x), np.inf,
                                      plan=self.plan, check=False)
        return v

    def U(self, w, beta):
        """(U_beta(l(w)), dU/dw, marginals) with w on the simplex (x = M w)."""
        M = self.num_circuits
        x = M * np.asarray(w, dtype=np.float64)
        ell = self.lengths(x)
        val, mu = smoothed_critical_path(self.num_nodes, self.src, self.dst, ell, beta, plan=self.plan, check=False)
        c = self._comm
        den = self._beps_comm + x[self.arc_edge[c]] * self.b_ocs
        dl_dw = -self.arc_bytes[c] * M * self.b_ocs / den ** 2
        grad = np.bincount(self.arc_edge[c], weights=mu[c] * dl_dw, minlength=self.num_edges)
        return val, grad, mu

    def free_energy(self, w, beta, b1) -> float:
        return self.U(w, beta)[0] + kl_divergence(w, self.prior) / b1

    def used_edges(self) -> np.ndarray:
        return np.unique(self.arc_edge[self._comm])


# ---------------------------------------------------------------------------------------------
# §2.3 entropic proximal gradient


@dataclass
class WiringResult:
    w: np.ndarray
    objective: np.ndarray          # F_k per accepted iterate (k = 0 is the start)
    U: np.ndarray
    KL: np.ndarray
    eta: np.ndarray
    iterations: int
    converged: bool
    beta: float
    b1: float
    proj_sweeps: int = 0
    seconds: float = 0.0


def optimize_wiring(problem: WiringProblem, b1: float, beta: float, *, w0=None, eta0: float | None = None,
                    max_iter: int = 1000, tol: float = 1e-11, proj_tol: float = 1e-12,
                    anneal: tuple | None = None) -> WiringResult:
    """Minimise F(w) = U_beta(l(w)) + KL(w||q)/b1 over P by entropic proximal gradient (mirror descent):

        log y = theta log q + (1-theta) log w_k - tau g_k,  theta = eta/(eta+b1), tau = eta b1/(eta+b1),
        w_{k+1} = KL-projection of y onto P,

    backtracking eta <- eta/2 until U(w+) <= U(w_k) + <g, w+ - w_k> + KL(w+||w_k)/eta, then eta <- 1.5 eta.
    `b1 = np.inf` drops the KL term (theta = 0, tau = eta). `anneal` = sequence of betas to warm-start
    through before `beta`. Returns the objective of every accepted iterate (linear convergence).
    """
    t0 = time.perf_counter()
    if anneal:
        w_start = w0
        for bt in anneal:
            r = optimize_wiring(problem, b1, bt, w0=w_start, eta0=eta0, max_iter=max_iter, tol=max(tol, 1e-6),
                                proj_tol=proj_tol)
            w_start = r.w
        w0 = w_start
    q = problem.prior
    log_q = np.log(q)
    b = problem.budget
    equality = abs(b.sum() - 2.0) <= 1e-9
    if w0 is None:
        logw = kl_project(log_q, problem.edges, b, equality=equality, tol=proj_tol)
    else:
        logw = np.log(np.maximum(np.asarray(w0, float), 1e-300))
    w = np.exp(logw)
    u, g, _ = problem.U(w, beta)
    inv_b1 = 0.0 if np.isinf(b1) else 1.0 / b1
    F = [u + kl_divergence(w, q) * inv_b1]
    Us, KLs = [u], [kl_divergence(w, q)]
    etas = []
    eta = eta0 if eta0 is not None else 1.0 / max(np.max(np.abs(g)), 1e-12)
    lam = None
    converged = False
    sweeps_total = 0
    it = 0
    calm = 0
    for it in range(1, max_iter + 1):
        for _ in range(60):
            if np.isinf(b1):
                theta, tau = 0.0, eta
            else:
                theta, tau = eta / (eta + b1), eta * b1 / (eta + b1)
            log_y = theta * log_q + (1.0 - theta) * logw - tau * g
            logw_new, info = kl_project(log_y, problem.edges, b, equality=equality, lam0=lam, tol=proj_tol,
                                        method="newton" if equality else "coordinate", return_info=True,
                                        residuals=False)
            sweeps_total += info["sweeps"]
            w_new = np.exp(logw_new)
            u_new, g_new, _ = problem.U(w_new, beta)
            kl_step = float(np.sum(w_new * (logw_new - logw)))
            if u_new <= u + g @ (w_new - w) + kl_step / eta + 1e-12 * max(1.0, abs(u)):
                break
            eta *= 0.5
        lam = info["lam"]
        etas.append(eta)
        step_l1 = float(np.abs(w_new - w).sum())
        w, logw, u, g = w_new, logw_new, u_new, g_new
        kl = float(np.sum(w * (logw - log_q)))
        F.append(u + kl * inv_b1)
        Us.append(u)
        KLs.append(kl)
        eta *= 1.5
        small = abs(F[-2] - F[-1]) <= tol * max(1.0, abs(F[-1]))
        calm = calm + 1 if small else 0
        if calm >= 3 or step_l1 <= 1e-12:
            converged = True
            break
    return WiringResult(w=w, objective=np.array(F), U=np.array(Us), KL=np.array(KLs), eta=np.array(etas),
                        iterations=it, converged=converged, beta=beta, b1=b1, proj_sweeps=sweeps_total,
                        seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# §2.5 exact integer solver, brute force, rounding


def _max_count(problem: WiringProblem) -> np.ndarray:
    d = problem.degree
    e = problem.edges
    return np.floor(np.minimum(d[e[:, 0]], d[e[:, 1]])).astype(np.int64)


def exact_wiring_milp(problem: WiringProblem, *, time_limit: float = 60.0, mip_rel_gap: float = 1e-6,
                      total_circuits: float | None = None) -> dict:
    """Integer optimum (beta -> inf, b1 -> inf): min t_sink over integer circuits x with
    sum_{e ni i} x_e <= d_i, via one-hot z_{e,k} (x_e = sum_k k z_{e,k}) and event times
    t_v >= t_u + l_uv (fixed arcs), t_v >= t_u + sum_k z_{e,k} (fixed + bytes/(B_eps + k B_ocs)) (comm arcs;
    exact because z is one-hot, so no big-M is needed). Solved by scipy.optimize.milp (HiGHS).
    Only edges used by some comm arc get variables (others are 0 w.l.o.g.).
    Returns {"x", "makespan", "status", "message", "seconds", "mip_gap"}.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    used = problem.used_edges()
    kmax = _max_count(problem)[used]
    # variable layout: [t_0..t_{N-1}] + z blocks
    N = problem.num_nodes
    zoff = np.r_[0, np.cumsum(kmax + 1)][:-1] + N
    nz = int((kmax + 1).sum())
    nvar = N + nz
    pos_of_edge = -np.ones(problem.num_edges, dtype=np.int64)
    pos_of_edge[used] = np.arange(used.size)
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    # one-hot
    for p in range(used.size):
        for k in range(kmax[p] + 1):
            rows.append(r); cols.append(zoff[p] + k); vals.append(1.0)
        lo.append(1.0); hi.append(1.0); r += 1
    # degree budgets
    n = len(problem.degree)
    for i in range(n):
        any_ = False
        for p, e in enumerate(used):
            if i in problem.edges[e]:
                for k in range(1, kmax[p] + 1):
                    rows.append(r); cols.append(zoff[p] + k); vals.append(float(k))
                any_ = True
        if any_:
            lo.append(-np.inf); hi.append(float(problem.degree[i])); r += 1
    if total_circuits is not None:
        for p in range(used.size):
            for k in range(1, kmax[p] + 1):
                rows.append(r); cols.append(zoff[p] + k); vals.append(float(k))
        lo.append(-np.inf); hi.append(float(total_circuits)); r += 1
    # arcs
    be = np.broadcast_to(np.asarray(problem.b_eps, dtype=np.float64), problem.src.shape)
    ub_z = np.ones(nz)
    for a in range(problem.src.size):
        u, v = problem.src[a], problem.dst[a]
        rows += [r, r]; cols += [v, u]; vals += [1.0, -1.0]
        e = problem.arc_edge[a]
        if e < 0:
            lo.append(problem.fixed_length[a]); hi.append(np.inf); r += 1
            continue
        p = pos_of_edge[e]
        for k in range(kmax[p] + 1):
            den = be[a] + k * problem.b_ocs
            if den <= 0:
                ub_z[zoff[p] + k - N] = 0.0          # infinite length: forbid
                continue
            rows.append(r); cols.append(zoff[p] + k); vals.append(-(problem.fixed_length[a] + problem.arc_bytes[a] / den))
        lo.append(0.0); hi.append(np.inf); r += 1
    A = coo_matrix((vals, (rows, cols)), shape=(r, nvar)).tocsr()
    c = np.zeros(nvar)
    c[N - 1] = 1.0
    lb = np.zeros(nvar)
    ub = np.r_[np.full(N, np.inf), ub_z]
    ub[0] = 0.0
    integrality = np.r_[np.zeros(N), np.ones(nz)]
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(lb, ub),
               options={"time_limit": time_limit, "mip_rel_gap": mip_rel_gap, "disp": False})
    out = {"status": int(res.status), "message": res.message, "seconds": time.perf_counter() - t0,
           "mip_gap": getattr(res, "mip_gap", np.nan), "x": None, "makespan": np.nan}
    if res.x is not None:
        x = np.zeros(problem.num_edges)
        z = res.x[N:]
        for p, e in enumerate(used):
            x[e] = float(np.argmax(z[zoff[p] - N: zoff[p] - N + kmax[p] + 1]))
        out["x"] = x.astype(np.int64)
        out["makespan"] = problem.makespan(x)
        out["lp_objective"] = float(res.fun)
    return out


def brute_force_wiring(problem: WiringProblem, total_circuits: float | None = None) -> tuple[float, np.ndarray]:
    """Enumerate every integer wiring on the used edges within the budgets (tiny instances only)."""
    used = problem.used_edges()
    kmax = _max_count(problem)[used]
    best, best_x = np.inf, None
    d = problem.degree
    for combo in itertools.product(*[range(k + 1) for k in kmax]):
        x = np.zeros(problem.num_edges)
        x[used] = combo
        load = np.bincount(problem.edges[:, 0], weights=x, minlength=d.size) + \
            np.bincount(problem.edges[:, 1], weights=x, minlength=d.size)
        if np.any(load > d + 1e-9):
            continue
        if total_circuits is not None and x.sum() > total_circuits + 1e-9:
            continue
        ms = problem.makespan(x)
        if ms < best - 1e-12:
            best, best_x = ms, x.astype(np.int64)
    return best, best_x


def round_wiring(w, edges, degree, num_circuits: float | None = None, *, method: str = "largest_remainder",
                 time_limit: float = 10.0, fill: bool = True) -> np.ndarray:
    """Round a relaxed wiring w (on the simplex) to integer circuits x within the port budgets.

    "largest_remainder": floor(M w), then add circuits in order of decreasing remainder where both
    endpoints still have a free port, then fill any remaining free port pairs by largest M w.
    "milp": min sum |x_e - M w_e| s.t. budgets and sum x <= M, by scipy.optimize.milp.
    `fill` then uses any leftover free port pairs (a circuit is never worse than EPS only).
    """
    w = np.asarray(w, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.int64)
    d = np.asarray(degree, dtype=np.float64)
    n = d.size
    M = 0.5 * d.sum() if num_circuits is None else float(num_circuits)
    target = M * w
    if method == "milp":
        from scipy.optimize import Bounds, LinearConstraint, milp
        E = len(edges)
        # variables x (int), s (|x - target|)
        B = np.zeros((n, E))
        B[edges[:, 0], np.arange(E)] = 1
        B[edges[:, 1], np.arange(E)] = 1
        A = np.block([[B, np.zeros((n, E))],
                      [np.eye(E), -np.eye(E)],
                      [np.eye(E), np.eye(E)],
                      [np.ones((1, E)), np.zeros((1, E))]])
        lo = np.r_[np.full(n, -np.inf), np.full(E, -np.inf), target, -np.inf]
        hi = np.r_[d, target, np.full(E, np.inf), np.floor(M + 1e-9)]
        c = np.r_[np.zeros(E), np.ones(E)]
        res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.r_[np.ones(E), np.zeros(E)],
                   bounds=Bounds(0, np.inf), options={"time_limit": time_limit})
        if res.x is None:  # pragma: no cover
            raise RuntimeError(f"rounding MILP failed: {res.message}")
        x = np.round(res.x[:E]).astype(np.int64)
        return _fill_free_ports(x, target, edges, d) if fill else x
    if method != "largest_remainder":
        raise ValueError(f"unknown method {method!r}")
    x = np.floor(target + 1e-9).astype(np.int64)
    free = d - (np.bincount(edges[:, 0], weights=x, minlength=n) + np.bincount(edges[:, 1], weights=x, minlength=n))
    rem = target - x
    budget_left = int(np.floor(M + 1e-9)) - int(x.sum())
    for e in np.argsort(-rem, kind="stable"):
        if budget_left <= 0 or rem[e] <= 1e-12:
            break
        i, j = edges[e]
        if free[i] >= 1 and free[j] >= 1:
            x[e] += 1
            free[i] -= 1
            free[j] -= 1
            budget_left -= 1
    return _fill_free_ports(x, target, edges, d, budget_left) if fill else x


def _fill_free_ports(x, target, edges, d, budget_left=None):
    """Use leftover port pairs (both endpoints free) on the edges with the largest relaxed weight."""
    n = d.size
    x = x.copy()
    free = d - (np.bincount(edges[:, 0], weights=x, minlength=n) + np.bincount(edges[:, 1], weights=x, minlength=n))
    if budget_left is None:
        budget_left = int(np.floor(0.5 * d.sum() + 1e-9)) - int(x.sum())
    for e in np.argsort(-target, kind="stable"):
        if budget_left <= 0:
            break
        i, j = edges[e]
        while free[i] >= 1 and free[j] >= 1 and budget_left > 0 and target[e] > 0:
            x[e] += 1
            free[i] -= 1
            free[j] -= 1
            budget_left -= 1
            break
    return x


def polish_wiring(problem: WiringProblem, x, *, beta_tiebreak: float | None = None, max_evals: int = 20_000,
                  time_limit: float | None = None, neighborhood: str = "all") -> tuple[np.ndarray, dict]:
    """Local search on an integer wiring (e.g. a rounded relaxation) for the hard makespan.

    Moves (all keep the port budgets): add a circuit between two nodes with free ports; shift one
    circuit (a,b) -> (a,c) when c has a free port; swap two circuits (a,b),(c,d) -> (a,c),(b,d) or
    (a,d),(b,c). Accept the first move that lowers (makespan, U_beta) lexicographically; the smoothed
    U_beta (beta_tiebreak, default 50 / mean arc length) moves the search across the plateaus of the max.
    Moves that put a circuit on an edge of the current critical path are tried first (only those can
    lower the makespan); `neighborhood="critical"` tries only those (faster, may stop earlier).
    Returns (x, {"makespan", "evals", "moves", "seconds"})."""
    t0 = time.perf_counter()
    x = np.asarray(x, dtype=np.int64).copy()
    edges = problem.edges
    n = len(problem.degree)
    d = problem.degree
    eid = -np.ones((n, n), dtype=np.int64)
    eid[edges[:, 0], edges[:, 1]] = np.arange(len(edges))
    eid[edges[:, 1], edges[:, 0]] = np.arange(len(edges))
    used = problem.used_edges()
    if beta_tiebreak is None:
        ell = problem.lengths(np.maximum(x, 1))
        beta_tiebreak = 50.0 / max(float(np.mean(ell[ell > 0])) if np.any(ell > 0) else 1.0, 1e-300)

    def score(x):
        ell = problem.lengths(x)
        hard, _ = smoothed_critical_path(problem.num_nodes, problem.src, problem.dst, ell, np.inf,
                                         plan=problem.plan, check=False)
        soft, _ = smoothed_critical_path(problem.num_nodes, problem.src, problem.dst, ell, beta_tiebreak,
                                         plan=problem.plan, check=False)
        return (round(hard, 12), soft)

    best = score(x)
    evals, moves = 1, 0

    def free_ports(x):
        return d - (np.bincount(edges[:, 0], x, n) + np.bincount(edges[:, 1], x, n))

    improved = True
    while improved and evals < max_evals:
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
        improved = False
        free = free_ports(x)
        ell_now = problem.lengths(x)
        _, mu_now = smoothed_critical_path(problem.num_nodes, problem.src, problem.dst, ell_now, np.inf,
                                           plan=problem.plan, check=False)
        crit = set(problem.arc_edge[(mu_now > 0.5) & (problem.arc_edge >= 0)].tolist())
        cand = []
        fr = np.flatnonzero(free >= 1)
        for a_i, a in enumerate(fr):                     # add
            for b in fr[a_i + 1:]:
                e = eid[a, b]
                if e >= 0 and e in used:
                    cand.append(((e, +1),))
        on = np.flatnonzero(x > 0)
        for e in on:                                     # shift
            a, b = edges[e]
            for keep, drop in ((a, b), (b, a)):
                for c in fr:
                    if c in (a, b):
                        continue
                    e2 = eid[keep, c]
                    if e2 >= 0:
                        cand.append(((e, -1), (e2, +1)))
        for i1 in range(len(on)):                        # swap
            a, b = edges[on[i1]]
            for i2 in range(i1 + 1, len(on)):
                c, dd = edges[on[i2]]
                if len({a, b, c, dd}) < 4:
                    continue
                for (p, q), (r, s) in (((a, c), (b, dd)), ((a, dd), (b, c))):
                    e1, e2 = eid[p, q], eid[r, s]
                    if e1 >= 0 and e2 >= 0:
                        cand.append(((on[i1], -1), (on[i2], -1), (e1, +1), (e2, +1)))
        adds_crit = [any(dl > 0 and e in crit for e, dl in mv) for mv in cand]
        cand = [mv for mv, c in zip(cand, adds_crit) if c] + \
            ([] if neighborhood == "critical" else [mv for mv, c in zip(cand, adds_crit) if not c])
        for mv in cand:
            y = x.copy()
            for e, dlt in mv:
                y[e] += dlt
            sc = score(y)
            evals += 1
            if sc < best:
                x, best = y, sc
                moves += 1
                improved = True
                break
            if evals >= max_evals:
                break
    return x, {"makespan": problem.makespan(x), "evals": evals, "moves": moves,
               "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------
# the pipeline or the exact MILP, whichever is the better tool for the size

EXACT_MAX_ENDPOINTS = 8  # up to here the MILP is exact in seconds (the pipeline is not: up to 4.98 % off), though
                         # not faster (benchmarks/bench_wiring.py --families; docs/scheduling.md)
PIPELINE_SCHEDULES = {  # (anneal betas, final beta, max iterations per phase, tol), betas per median comm arc
    "accurate": ((1.0, 10.0), 100.0, 400, 1e-9),
    "fast": ((3.0,), 30.0, 40, 1e-6),
}


def solve_wiring(problem: WiringProblem, *, b1: float = 1e6, schedule: str = "fast",
                 exact_max_endpoints: int = EXACT_MAX_ENDPOINTS, milp_time_limit: float = 60.0
                 ) -> tuple[np.ndarray, dict]:
    """Integer circuits for `problem`: the exact MILP (`exact_wiring_milp`) when it has at most
    `exact_max_endpoints` endpoints, where it is optimal in seconds (though not faster than the relaxation:
    docs/scheduling.md, "Over instance families"); above, the
    pipeline: `optimize_wiring` (β annealed per `schedule`, in units of 1 / the median comm arc), rounded
    (`round_wiring`), then critical-edge polish (`polish_wiring`). A MILP that returns no wiring within its
    time limit falls back to the pipeline. Returns (x, {"method", "makespan", "seconds", ...})."""
    t0 = time.perf_counter()
    if len(problem.degree) <= exact_max_endpoints:
        milp = exact_wiring_milp(problem, time_limit=milp_time_limit)
        if milp["x"] is not None:
            return milp["x"], {"method": "milp", "makespan": milp["makespan"], "seconds": time.perf_counter() - t0,
                               "milp_status": milp["message"], "mip_gap": milp["mip_gap"]}
    betas, final, iters, tol = PIPELINE_SCHEDULES[schedule]
    ell = problem.lengths(np.ones(problem.num_edges))
    comm = problem.arc_edge >= 0
    scale = float(np.median(ell[comm])) if comm.any() else 1.0
    res = optimize_wiring(problem, b1, final / scale, anneal=tuple(b / scale for b in betas), max_iter=iters,
                          tol=tol)
    x, polish = polish_wiring(problem, round_wiring(res.w, problem.edges, problem.degree), neighborhood="critical")
    return x, {"method": "pipeline", "makespan": polish["makespan"], "seconds": time.perf_counter() - t0,
               "schedule": schedule}
