"""Reconfiguration schedules and regret (spec algorithms.md §3).

`costs` is T x W: seconds per epoch for each candidate wiring; `switch_cost` is a scalar (every change
costs C) or a W x W matrix C[w, w'] (diagonal ignored). Schedules are integer arrays of length T: the
wiring in force during each epoch. Switching happens between epochs; a schedule pays
sum_t costs[t, s_t] + C[start, s_0] + sum_t C[s_{t-1}, s_t].
"""
from __future__ import annotations

import itertools

import numpy as np

__all__ = ["switch_matrix", "schedule_cost", "offline_optimum", "best_static", "free_switching",
           "threshold_policy", "default_threshold", "estimate_variation", "regret_report",
           "brute_force_schedule", "exposed_reconfiguration_samples", "lognormal_from_mean_p99",
           "switch_cost_from_profile",
           "regime_costs", "regret_experiment", "loglog_slope", "regret_curves"]


def switch_matrix(switch_cost, W: int) -> np.ndarray:
    """W x W switching-cost matrix with zero diagonal from a scalar or a matrix."""
    C = np.asarray(switch_cost, dtype=np.float64)
    if C.ndim == 0:
        C = np.full((W, W), float(C))
    if C.shape != (W, W):
        raise ValueError(f"switch_cost must be a scalar or {W}x{W}")
    C = C.copy()
    np.fill_diagonal(C, 0.0)
    return C


def schedule_cost(costs, schedule, switch_cost, start: int | None = None) -> tuple[float, int]:
    """(total cost, number of switches) of a schedule. start=None means the first epoch is free to pick."""
    costs = np.asarray(costs, dtype=np.float64)
    s = np.asarray(schedule, dtype=np.int64)
    C = switch_matrix(switch_cost, costs.shape[1])
    prev = np.r_[s[0] if start is None else start, s[:-1]]
    sw = C[prev, s]
    return float(costs[np.arange(len(s)), s].sum() + sw.sum()), int(np.count_nonzero(prev != s))


def offline_optimum(costs, switch_cost, start: int | None = 0) -> tuple[float, np.ndarray]:
    """OPT_C by dynamic programming with back-pointers, O(T W^2) (O(T W) for a scalar C).

        V_1(w) = c_1(w) + C(start, w),   V_t(w) = c_t(w) + min_w' [V_{t-1}(w') + C(w', w)].
    """
    costs = np.asarray(costs, dtype=np.float64)
    T, W = costs.shape
    scalar = np.ndim(switch_cost) == 0
    C = switch_matrix(switch_cost, W)
    back = np.zeros((T, W), dtype=np.int64)
    V = costs[0] + (0.0 if start is None else C[start])
    for t in range(1, T):
        if scalar:
            j = int(np.argmin(V))
            stay = V
            move = V[j] + float(switch_cost)
            take_move = move < stay
            back[t] = np.where(take_move, j, np.arange(W))
            V = costs[t] + np.where(take_move, move, stay)
        else:
            tot = V[:, None] + C                       # [w', w]
            back[t] = np.argmin(tot, axis=0)
            V = costs[t] + tot[back[t], np.arange(W)]
    sched = np.zeros(T, dtype=np.int64)
    sched[-1] = int(np.argmin(V))
    for t in range(T - 1, 0, -1):
        sched[t - 1] = back[t, sched[t]]
    return float(V.min()), sched


def best_static(costs) -> tuple[float, int]:
    """Best fixed wiring in hindsight: (min_w sum_t c_t(w), argmin)."""
    tot = np.asarray(costs, dtype=np.float64).sum(axis=0)
    k = int(np.argmin(tot))
    return float(tot[k]), k


def free_switching(costs) -> tuple[float, np.ndarray]:
    """Oracle with free switching: sum_t min_w c_t(w)."""
    costs = np.asarray(costs, dtype=np.float64)
    return float(costs.min(axis=1).sum()), np.argmin(costs, axis=1)


def brute_force_schedule(costs, switch_cost, start: int | None = 0) -> tuple[float, np.ndarray]:
    """Enumerate all W^T schedules (tiny T only): oracle for the DP."""
    costs = np.asarray(costs, dtype=np.float64)
    T, W = costs.shape
    best, arg = np.inf, None
    for s in itertools.product(range(W), repeat=T):
        c, _ = schedule_cost(costs, s, switch_cost, start)
        if c < best - 1e-12:
            best, arg = c, np.array(s)
    return best, arg


def estimate_variation(costs, regimes=None) -> tuple[float, int]:
    """(V1, Gamma): V1 = mean over within-regime epochs of sup_w |c_t(w) - c_{t-1}(w)| (s/epoch);
    Gamma = number of regimes (change points + 1). Without labels, regimes are the runs of the
    best wiring of a 5-epoch moving average of the costs."""
    costs = np.asarray(costs, dtype=np.float64)
    T = costs.shape[0]
    if regimes is None:
        k = min(5, T)
        ker = np.ones(k) / k
        sm = np.stack([np.convolve(costs[:, w], ker, mode="same") for w in range(costs.shape[1])], axis=1)
        regimes = np.cumsum(np.r_[0, np.diff(np.argmin(sm, axis=1)) != 0])
    regimes = np.asarray(regimes)
    if T < 2:
        return 0.0, 1
    dif = np.max(np.abs(np.diff(costs, axis=0)), axis=1)
    same = regimes[1:] == regimes[:-1]
    V1 = float(dif[same].mean()) if same.any() else float(dif.mean())
    gamma = int(1 + np.count_nonzero(~same))
    return V1, gamma


def default_threshold(C: float, V1: float, T: int, Gamma: int) -> float:
    """tau* = sqrt(C V1 T / Gamma), which balances Gamma*tau against C*V1*T/tau.

    A heuristic, not a proven optimum: the two terms are the intuition for the lazy policy's cost (about
    one threshold's worth of waste per regime, and switches caused by within-regime variation), not the
    terms of a proven regret bound."""
    return float(np.sqrt(max(C, 0.0) * max(V1, 0.0) * T / max(Gamma, 1)))


def threshold_policy(costs, switch_cost, threshold: float | None = None, start: int = 0, *, estimates=None,
                     alarms=None, gain_horizon: int | None = None, switch_cost_draws=None,
                     V1: float | None = None, Gamma: int | None = None, return_details: bool = False):
    """Lazy threshold policy. Each epoch pay c_t(w); w_hat = argmin c_hat_t (the optimizer on the
    current estimate, default the observed c_t); E += c_t(w) - c_t(w_hat); if E >= threshold, or an
    `alarms[t]` (e.g. GLR-CUSUM) fires and (c_t(w) - c_t(w_hat)) * horizon > C(w, w_hat), switch to
    w_hat for the next epoch and pay C; reset E.

    threshold=None uses tau* = sqrt(C V1 T / Gamma) (V1, Gamma from `estimate_variation` unless given,
    C the mean off-diagonal switching cost). `switch_cost_draws`, if given, is a sequence of realised
    switching costs consumed one per switch (the measured-delay distribution); otherwise the switch
    pays C(w, w_hat). Returns (total, schedule) or, with return_details, also a dict.
    """
    costs = np.asarray(costs, dtype=np.float64)
    T, W = costs.shape
    C = switch_matrix(switch_cost, W)
    est = costs if estimates is None else np.asarray(estimates, dtype=np.float64)
    if threshold is None:
        v1, g = estimate_variation(costs)
        v1 = v1 if V1 is None else V1
        g = g if Gamma is None else Gamma
        Cbar = float(C[~np.eye(W, dtype=bool)].mean()) if W > 1 else 0.0
        threshold = default_threshold(Cbar, v1, T, g)
    draws = None if switch_cost_draws is None else iter(np.asarray(switch_cost_draws, dtype=np.float64).ravel())
    w = int(start)
    ecum = 0.0
    total = 0.0
    sched = np.zeros(T, dtype=np.int64)
    switches = []
    for t in range(T):
        sched[t] = w
        total += costs[t, w]
        w_hat = int(np.argmin(est[t]))
        gain = est[t, w] - est[t, w_hat]
        ecum += gain
        if w_hat == w:
            continue
        trigger = ecum >= threshold
        if not trigger and alarms is not None and bool(alarms[t]):
            horizon = (T - 1 - t) if gain_horizon is None else gain_horizon
            trigger = gain * horizon > C[w, w_hat]
        if trigger and t < T - 1:
            total += C[w, w_hat] if draws is None else float(next(draws))
            switches.append(t)
            w = w_hat
            ecum = 0.0
    if return_details:
        return total, sched, {"threshold": float(threshold), "switch_epochs": np.array(switches, dtype=np.int64)}
    return total, sched


def regret_report(costs, switch_cost, schedule=None, *, policy_total: float | None = None, start: int = 0,
                  **policy_kw) -> dict:
    """Policy cost and its regret against the best static wiring, the offline optimum OPT_C and the
    free-switching oracle (all in seconds of training time). Runs the threshold policy unless a
    schedule (and optionally its realised total) is given."""
    costs = np.asarray(costs, dtype=np.float64)
    details = {}
    if schedule is None:
        policy_total, schedule, details = threshold_policy(costs, switch_cost, start=start, return_details=True,
                                                           **policy_kw)
    elif policy_total is None:
        policy_total, _ = schedule_cost(costs, schedule, switch_cost, start)
    _, nsw = schedule_cost(costs, schedule, switch_cost, start)
    static, k = best_static(costs)
    opt, opt_sched = offline_optimum(costs, switch_cost, start)
    free, _ = free_switching(costs)
    return {"policy": policy_total, "switches": nsw, "best_static": static, "static_choice": k,
            "offline_opt": opt, "offline_switches": schedule_cost(costs, opt_sched, switch_cost, start)[1],
            "free_switching": free, "regret_static": policy_total - static, "regret_offline": policy_total - opt,
            "regret_oracle": policy_total - free, "schedule": np.asarray(schedule), "offline_schedule": opt_sched,
            "threshold": details.get("threshold", np.nan)}


# ---------------------------------------------------------------------------------------------
# switching cost from measurements


def exposed_reconfiguration_samples(events, *, overlap_s: float = 0.0, start_stage: str = "ocs_command_sent",
                                    end_stages=("first_packet", "port_active")) -> np.ndarray:
    """Exposed reconfiguration time per cycle (s) from a turnaround run's events (harness schema:
    run_id, cycle, stage, host, port, t_ns, ...). d_k = (last port ready) - (first command sent), the
    port being ready at its first `end_stages[0]` event (falling back to the next stage if a port never
    reports it); exposed = max(0, d_k - overlap_s). Returns one sample per complete cycle: use it as a
    distribution, not just its mean."""
    import pandas as pd

    df = pd.DataFrame(events)
    key = ["run_id", "cycle"] if "run_id" in df.columns else ["cycle"]
    starts = df[df["stage"] == start_stage].groupby(key)["t_ns"].min()
    ready = None
    for st in end_stages:
        sub = df[df["stage"] == st].groupby(key + ["host", "port"])["t_ns"].min()
        ready = sub if ready is None else ready.combine_first(sub)
    if ready is None or ready.empty or starts.empty:
        return np.zeros(0)
    last = ready.groupby(level=list(range(len(key)))).max()
    d = (last - starts).dropna()
    d = d[d >= 0].to_numpy(dtype=np.float64) * 1e-9
    return np.maximum(0.0, d - overlap_s)


def lognormal_from_mean_p99(mean: float, p99: float, size: int, seed=None) -> np.ndarray:
    """Samples of a lognormal with the given mean and 99th percentile (a delay profile summary,
    e.g. MixNet's OCS 41.44 ms mean / 60 ms p99)."""
    from analysis.delays import lognormal_from_mean_p99 as params

    mu, s = params(mean, p99)
    return np.random.default_rng(seed).lognormal(mu, s, size)


def switch_cost_from_profile(profile: dict, size: int, *, ports: int = 1, overlap_s: float = 0.0,
                             include_nic: bool = True, seed=None) -> np.ndarray:
    """Exposed reconfiguration time samples (s) from a timing profile mapping (the parsed YAML):
    d = ocs.switch + max over `ports` switched ports of (los_clear + cdr_lock + phy_up + port_active)
    (done when the last link is ready, §6.3); exposed = max(0, d - overlap_s). `include_nic=False` keeps
    only the mirror time (what MixNet's results assumed)."""
    from analysis.delays import Delay

    rng = np.random.default_rng(seed)
    d = Delay.from_spec(profile["ocs"]["switch"]).samples(rng, size)
    if include_nic:
        nic = profile.get("nic", {})
        per_port = np.zeros((size, ports))
        for stage in ("los_clear", "cdr_lock", "phy_up", "port_active"):
            if stage in nic:
                per_port += Delay.from_spec(nic[stage]).samples(rng, (size, ports))
        d = d + per_port.max(axis=1)
    return np.maximum(0.0, d - overlap_s)


# ---------------------------------------------------------------------------------------------
# experiment: regret vs switching-cost scale


def regime_costs(T: int, W: int, n_regimes: int, *, gap: float = 0.1, noise: float = 0.01, base: float = 1.0,
                 drift: float = 0.0, seed=None) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic T x W costs with `n_regimes` equal-length regimes; in each regime one wiring is best
    by `gap` (s/epoch); i.i.d. Gaussian noise (s) and an optional random-walk drift. Returns (costs, regime)."""
    rng = np.random.default_rng(seed)
    regime = np.minimum((np.arange(T) * n_regimes) // T, n_regimes - 1)
    best = rng.integers(0, W, n_regimes)
    for r in range(1, n_regimes):
        while W > 1 and best[r] == best[r - 1]:
            best[r] = rng.integers(0, W)
    costs = np.full((T, W), base + gap)
    costs[np.arange(T), best[regime]] = base
    costs += noise * rng.standard_normal((T, W))
    if drift:
        costs += np.cumsum(drift * rng.standard_normal((T, W)), axis=0)
    return costs, regime


def loglog_slope(x, y) -> float:
    """Least-squares slope of log y on log x over the points with x, y > 0."""
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if ok.sum() < 2:
        return np.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def regret_experiment(traffic_epochs, candidate_costs=None, switch_cost_samples=None, *, cost_builder=None,
                      cost_scales=(0.25, 0.5, 1, 2, 4, 8, 16), seed=0, start: int = 0, regimes=None,
                      use_alarms: bool = False, detector_kw: dict | None = None, n_draws: int = 200,
                      threshold_scale: float = 1.0) -> dict:
    """Regret of the threshold policy vs the best static wiring and the offline optimum, per switching-cost
    scale. `candidate_costs` (T x W, s/epoch) or a cost builder `f(traffic_epochs) -> T x W` (passed in that
    position or as `cost_builder=`).
    `switch_cost_samples`: measured exposed reconfiguration times (s); C at scale k is k * samples.

    For each scale the policy (tau* = threshold_scale * sqrt(C V1 T / Gamma), C = mean of the scaled
    samples) and OPT_C (DP on the mean C) are compared at the mean C; `n_draws` Monte Carlo replays then
    charge every switch of both schedules an independent draw from the scaled samples, giving the regret
    distribution (mean, p5, p95). With `use_alarms`, a GLR-CUSUM (KT, threshold Monte-Carlo calibrated to a
    5 % false-alarm probability over T under the reference window's law, analytic bound beside it in
    "detector", unless `detector_kw` says otherwise) on `traffic_epochs` adds alarm triggers; traffic is flattened per epoch
    and, if it is bytes (non-integer or > 1e7), counted in `detector_kw["chunk_bytes"]` (1 MiB) units. Returns {"table": DataFrame, "slope_static", "slope_offline", "heuristic_slope": 0.5,
    "V1", "Gamma", ...}. Slopes are fitted on the scales with positive regret only; with regime changes the
    policy often beats every fixed wiring (negative regret vs best static), then "slope_static" is NaN or
    rests on few points and "static_regret_negative" is True. Column "heuristic_scale" = 2 sqrt(Gamma C V1 T)
    is the heuristic's balance value at tau*, NOT a proven bound: regret against the offline optimum can
    exceed it ("exceeds_heuristic_offline"), and its sqrt(C) slope is not a prediction of the realised one.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    if callable(candidate_costs):
        candidate_costs, cost_builder = None, candidate_costs
    if candidate_costs is None:
        if cost_builder is None:
            raise ValueError("give candidate_costs or cost_builder")
        candidate_costs = cost_builder(traffic_epochs)
    costs = np.asarray(candidate_costs, dtype=np.float64)
    T, W = costs.shape
    samples = np.asarray([1.0] if switch_cost_samples is None else switch_cost_samples, dtype=np.float64).ravel()
    V1, Gamma = estimate_variation(costs, regimes)
    alarms = detector = None
    if use_alarms:
        from .detect import GlrCusum, default_threshold as detector_threshold
        kw = dict(window=20, threshold=None, chunk_bytes=2**20)
        kw.update(detector_kw or {})
        counts = np.asarray(traffic_epochs, dtype=np.float64).reshape(T, -1)
        chunk = kw.pop("chunk_bytes")
        if not np.allclose(counts, np.round(counts)) or counts.max(initial=0) > 1e7:
            counts = np.round(counts / chunk)       # bytes -> independent units (chunks), spec §4
        window = int(kw.pop("window"))
        ref = int(kw.pop("reference_epochs", window))
        p0 = kw.pop("p0", None)
        if p0 is None:                              # pre-change law from a reference window (spec §4)
            p0 = counts[:max(1, ref)].sum(axis=0) + 0.5
        h = kw.pop("threshold")
        detector = {"threshold": h, "calibration": "given"}
        if h is None:
            kw.setdefault("variant", "kt")
            detector = detector_threshold(counts[:max(1, ref)], window, T, 0.05, kw["variant"], seed=seed)
            detector["calibration"] = "monte_carlo"
            h = detector["threshold"]
        det = GlrCusum(p0, window, h, **kw)
        alarms = np.zeros(T, dtype=bool)
        origin = 0
        for t in range(T):
            if det.update(counts[t]):
                alarms[t] = True
                k_hat = origin + det.change_estimate     # new regime's law from the post-change epochs
                det.reset(p0=counts[k_hat: t + 1].sum(axis=0) + 0.5)
                origin = t + 1
    rows = []
    static, _ = best_static(costs)
    free, _ = free_switching(costs)
    for k in cost_scales:
        s = k * samples
        Cm = float(s.mean())
        tau = threshold_scale * default_threshold(Cm, V1, T, Gamma)
        pol, sched, det_ = threshold_policy(costs, Cm, tau, start, alarms=alarms, return_details=True)
        opt, osched = offline_optimum(costs, Cm, start)
        base_pol = float(costs[np.arange(T), sched].sum())
        base_opt = float(costs[np.arange(T), osched].sum())
        nsw_p = schedule_cost(costs, sched, Cm, start)[1]
        nsw_o = schedule_cost(costs, osched, Cm, start)[1]
        draws_p = base_pol + rng.choice(s, (n_draws, nsw_p)).sum(axis=1) if nsw_p else np.full(n_draws, base_pol)
        draws_o = base_opt + rng.choice(s, (n_draws, nsw_o)).sum(axis=1) if nsw_o else np.full(n_draws, base_opt)
        rs, ro = draws_p - static, draws_p - draws_o
        rows.append({"scale": k, "C_mean": Cm, "C_p99": float(np.quantile(s, 0.99)), "threshold": tau,
                     "policy": pol, "switches": nsw_p, "best_static": static, "offline_opt": opt,
                     "offline_switches": nsw_o, "free_switching": free, "regret_static": pol - static,
                     "regret_offline": pol - opt, "regret_static_mc_mean": float(rs.mean()),
                     "regret_static_p05": float(np.quantile(rs, 0.05)),
                     "regret_static_p95": float(np.quantile(rs, 0.95)),
                     "regret_offline_mc_mean": float(ro.mean()),
                     "regret_offline_p05": float(np.quantile(ro, 0.05)),
                     "regret_offline_p95": float(np.quantile(ro, 0.95)),
                     "heuristic_scale": 2.0 * np.sqrt(Gamma * Cm * V1 * T)})
    table = pd.DataFrame(rows)
    table["exceeds_heuristic_static"] = table["regret_static"] > table["heuristic_scale"]
    table["exceeds_heuristic_offline"] = table["regret_offline"] > table["heuristic_scale"]
    return {"table": table, "slope_static": loglog_slope(table["C_mean"], table["regret_static"]),
            "static_regret_negative": bool((table["regret_static"] <= 0).any()),
            "slope_offline": loglog_slope(table["C_mean"], table["regret_offline"]),
            "heuristic_slope": 0.5, "V1": V1, "Gamma": Gamma, "T": T, "W": W,
            "alarms": alarms, "detector": detector}


def regret_curves(result: dict) -> dict:
    """Arrays for plotting regret vs C (log-log) next to the sqrt(C) heuristic scale; no plotting here."""
    tb = result["table"]
    C = tb["C_mean"].to_numpy()
    ref = tb["heuristic_scale"].to_numpy()
    return {"C": C, "regret_static": tb["regret_static"].to_numpy(), "regret_offline": tb["regret_offline"].to_numpy(),
            "regret_static_band": (tb["regret_static_p05"].to_numpy(), tb["regret_static_p95"].to_numpy()),
            "regret_offline_band": (tb["regret_offline_p05"].to_numpy(), tb["regret_offline_p95"].to_numpy()),
            "heuristic_scale": ref, "slope_static": result["slope_static"],
            "slope_offline": result["slope_offline"], "heuristic_slope": 0.5}
