"""Per-stage delay tables and summaries whose unit of replication is the cycle. Pure: DataFrames in, numbers out.

Conventions:
- A cycle's reference time is its earliest `ocs_command_sent`; its `ocs_command_completed` is the latest
  completion (a cycle may drive several switches).
- Per port (host, port) the first event of each stage in a cycle counts (later repeats are flaps).
- Delays are in the events' unit (ns); missing stages give NaN.
- Stage-delay columns are named by stage; chain-duration columns are `chain_<name>` (CHAIN).
- The ports of one cycle share one OCS draw: intervals treat the cycle, never the port, as the independent
  unit (per-cycle means, one port per cycle for order statistics, resampling whole cycles).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from scipy import stats

from analysis.keys import Keys, arrow_strings, equals, first_of_groups

from analysis.stages import CHAIN, PORT_CHAIN, STAGES_DOWN, STAGES_UP  # noqa: F401  (the one stage table)

UP_STAGES = STAGES_UP[1:]  # delays after ocs_command_sent
NIC_STAGES = PORT_CHAIN + STAGES_DOWN
# CHAIN: per-port chain durations, name -> (later stage, earlier stage); names match the profile keys.


def _cycle_times(events: pd.DataFrame) -> pd.DataFrame:
    """Per cycle: ocs_command_sent (earliest) and ocs_command_completed (latest)."""
    t, cycle = events["t_ns"].to_numpy(np.int64), events["cycle"].to_numpy(np.int64)
    out = {}
    for name, reduce in (("ocs_command_sent", np.minimum), ("ocs_command_completed", np.maximum)):
        order, starts = first_of_groups(cycle, equals(events["stage"], name))
        out[name] = pd.Series(reduce.reduceat(t[order], starts) if len(order) else t[:0], index=cycle[order[starts]])
    return pd.DataFrame(out).astype("float64").rename_axis("cycle")


def port_stage_times(events: pd.DataFrame) -> pd.DataFrame:
    """Absolute stage times, one row per (cycle, host, port), one column per NIC stage (first occurrence)."""
    stage = pc.index_in(arrow_strings(events["stage"]), value_set=pa.array(NIC_STAGES, pa.string()))
    stage = stage.fill_null(-1).to_numpy().astype(np.int64)
    keys = Keys([events], ["cycle", "host", "port"])
    nic = keys.valid[0] & (stage >= 0)
    t = events["t_ns"].to_numpy(np.int64)
    order, starts = first_of_groups(keys.codes[0] * len(NIC_STAGES) + stage, nic, by=t)
    first = order[starts]  # each (port, stage)'s earliest row, in (cycle, host, port, stage) order
    port_code = keys.codes[0][first]
    new_port = np.r_[True, port_code[1:] != port_code[:-1]] if len(first) else np.array([], dtype=bool)
    row = np.cumsum(new_port) - 1
    wide = np.full((int(new_port.sum()), len(NIC_STAGES)), np.nan)
    wide[row, stage[first]] = t[first]
    return pd.DataFrame(wide, index=keys.index(0, first[new_port]), columns=list(NIC_STAGES))


def stage_table(events: pd.DataFrame, cycles: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (cycle, host, port): each up-stage's delay after the cycle's ocs_command_sent, plus the chain
    durations (CHAIN, columns `chain_<name>`) between consecutive stages. (`cycles`: the events' `_cycle_times`,
    where the caller has them.)"""
    cycles = _cycle_times(events) if cycles is None else cycles
    ports = port_stage_times(events)
    if ports.empty:
        columns = list(UP_STAGES) + [f"chain_{name}" for name in CHAIN]
        index = pd.MultiIndex.from_arrays([[], [], []], names=["cycle", "host", "port"])
        return pd.DataFrame(index=index, columns=columns, dtype="float64")
    cycle_of_row = ports.index.get_level_values("cycle")
    sent = cycles["ocs_command_sent"].reindex(cycle_of_row).to_numpy()
    absolute = {name: ports[name].to_numpy() for name in ports.columns}
    absolute["ocs_command_completed"] = cycles["ocs_command_completed"].reindex(cycle_of_row).to_numpy()
    table = {stage: absolute[stage] - sent for stage in UP_STAGES}
    table.update({f"chain_{name}": absolute[later] - absolute[earlier] for name, (later, earlier) in CHAIN.items()})
    return pd.DataFrame(table, index=ports.index)


def ocs_switch_times(events: pd.DataFrame, cycles: pd.DataFrame | None = None) -> pd.Series:
    """Per cycle: latest ocs_command_completed − earliest ocs_command_sent."""
    cycles = _cycle_times(events) if cycles is None else cycles
    return (cycles["ocs_command_completed"] - cycles["ocs_command_sent"]).dropna().rename("ocs_switch")


def turnaround(events: pd.DataFrame) -> pd.Series:
    """Per cycle: max over ports of first_packet − ocs_command_sent (NaN-free: cycles lacking either drop)."""
    table = stage_table(events)
    if table.empty:
        return pd.Series([], dtype="float64", name="turnaround")
    per_cycle = table["first_packet"].groupby(level="cycle").max()
    return per_cycle.dropna().rename("turnaround")


def _units(x: np.ndarray, cycles) -> np.ndarray | None:
    """Cycle ids aligned with x (None: every sample is its own independent unit)."""
    if cycles is None:
        return None
    c = np.asarray(cycles)
    if c.shape != x.shape:
        raise ValueError(f"cycles has shape {c.shape}, samples {x.shape}")
    return c


def cycle_means(samples, cycles) -> np.ndarray:
    """One value per cycle: the mean of that cycle's finite samples (cycles without any are dropped)."""
    x = np.asarray(samples, dtype=float)
    c = _units(x, cycles)
    keep = np.isfinite(x)
    return pd.Series(x[keep]).groupby(c[keep]).mean().to_numpy()


def per_cycle(table: pd.DataFrame, column: str, how: str = "max") -> pd.Series:
    """One value per cycle from a per-port table (stage_table): e.g. the slowest port's delay (`how="max"`).
    NaN rows do not count; cycles without any value are dropped."""
    return table[column].dropna().groupby(level="cycle").agg(how).rename(column)


def one_per_cycle(samples, cycles, rng: np.random.Generator) -> np.ndarray:
    """One sample drawn at random from each cycle: independent draws from the per-port (marginal)
    distribution whatever the dependence between the ports of one cycle."""
    x = np.asarray(samples, dtype=float)
    c = _units(x, cycles)
    keep = np.isfinite(x)
    x, c = x[keep], c[keep]
    order = np.argsort(c, kind="stable")
    x, c = x[order], c[order]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    sizes = np.diff(np.r_[starts, len(c)])
    return x[starts + (rng.random(len(starts)) * sizes).astype(int)]


def resample_cycles(samples, cycles, rng: np.random.Generator, n_resamples: int) -> list[np.ndarray]:
    """`n_resamples` bootstrap samples, each the pooled samples of as many cycles drawn with replacement:
    the samples of one cycle always travel together. Without `cycles`, every sample is its own cycle."""
    x = np.asarray(samples, dtype=float)
    c = np.arange(x.size) if cycles is None else _units(x, cycles)
    keep = np.isfinite(x)
    x, c = x[keep], c[keep]
    _, inverse = np.unique(c, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    x = x[order]
    sizes = np.bincount(inverse)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    out = []
    for picked in rng.integers(0, len(sizes), size=(n_resamples, len(sizes))):
        out.append(np.concatenate([x[starts[k]:starts[k] + sizes[k]] for k in picked]))
    return out


def cluster_bootstrap(samples, cycles, statistic, *, rng_seed: int, n_resamples: int = 2000,
                      confidence: float = 0.95, method: str = "percentile") -> dict:
    """Bootstrap that resamples whole cycles (a cluster bootstrap) through scipy.stats.bootstrap.

    `statistic(values, cycle_index)` gets the pooled samples of the resampled cycles and, aligned with
    them, the position of their cycle in the resample (0..k-1), and returns a float. The samples of one
    cycle always travel together: ports sharing one OCS draw are never treated as independent.
    Returns {"estimate", "ci": [low, high], "n_cycles"}.
    """
    x = np.asarray(samples, dtype=float)
    c = _units(x, cycles)
    keep = np.isfinite(x)
    x, c = x[keep], c[keep]
    ids, inverse = np.unique(c, return_inverse=True)
    groups = [x[inverse == k] for k in range(len(ids))]

    def on_cycles(picked):
        chosen = [groups[int(k)] for k in picked]
        values = np.concatenate(chosen) if chosen else np.array([])
        index = np.repeat(np.arange(len(chosen)), [len(g) for g in chosen])
        return float(statistic(values, index))

    estimate = on_cycles(np.arange(len(ids)))
    if len(ids) < 2:
        return {"estimate": estimate, "ci": [float("nan")] * 2, "n_cycles": int(len(ids))}
    res = stats.bootstrap((np.arange(len(ids)),), on_cycles, vectorized=False, n_resamples=n_resamples,
                          confidence_level=confidence, method=method, random_state=np.random.default_rng(rng_seed))
    ci = res.confidence_interval
    return {"estimate": estimate, "ci": [float(ci.low), float(ci.high)], "n_cycles": int(len(ids))}


def quantile_needs_n(p: float, confidence: float = 0.95) -> int:
    """Smallest n for which a two-sided distribution-free (order-statistic) interval for the p-quantile
    exists at `confidence`: the sample maximum must exceed the quantile with probability >= 1 - α/2."""
    tail = (1 - confidence) / 2
    far = max(p, 1 - p)
    return int(math.floor(math.log(tail) / math.log(far))) + 1


def quantile_interval(units, p: float, confidence: float = 0.95) -> dict:
    """Distribution-free interval for the p-quantile from independent units (scipy.stats.quantile_test's
    order-statistic interval; coverage >= `confidence` for any continuous distribution).

    Where n is too small for both ends, "ci" is None, "needs_n" says how many units would do and
    "lower" / "upper" hold the one-sided bound at `confidence` that the data do support (else None).
    """
    x = np.asarray(units, dtype=float)
    x = x[np.isfinite(x)]
    out = {"ci": None, "lower": None, "upper": None, "needs_n": quantile_needs_n(p, confidence)}
    if x.size == 0:
        return out
    if x.size >= out["needs_n"] and np.ptp(x) > 0:
        ci = stats.quantile_test(x, q=float(np.median(x)), p=p).confidence_interval(confidence)
        if np.isfinite(ci.low) and np.isfinite(ci.high):
            out["ci"] = [float(ci.low), float(ci.high)]
            return out
    if np.ptp(x) == 0 and x.size >= out["needs_n"]:
        out["ci"] = [float(x[0]), float(x[0])]
        return out
    for side, key, attr in (("greater", "lower", "low"), ("less", "upper", "high")):
        bound = getattr(stats.quantile_test(x, q=float(np.median(x)), p=p, alternative=side)
                        .confidence_interval(confidence), attr)
        if np.isfinite(bound):
            out[key] = float(bound)
    return out


# The fewest independent units an interval is given for: below them its coverage falls away (bootstrap-t at 2
# cycles: 0 %, every resample's t is 0; at 3: 83 %; from 5: 92.5-95.5 % on the bench-like and skewed models;
# the two-sample difference holds 93-96 % from 10 cycles a side, 91 % at 4-6): benchmarks/coverage.py and
# benchmarks/coverage_difference.py.
MIN_MEAN_UNITS = 5
MIN_DIFFERENCE_UNITS = 10
_RESAMPLE_VALUES = 1 << 20  # bootstrap values held at once (8 MiB: at 32 a run's end grew by ~110 MB over its summaries)
# From here on the bootstrap-t's quantiles are taken from their Edgeworth expansion instead of 1999 resamples: the
# two agree to O(1/n) (Hall 1992, §3.5), within 1 % of the interval's width at 5 000 units of a lognormal σ 1,
# and the expansion costs O(n), not O(1999 n) (at 10^5 cycles ~10 ms a column, not ~2 s). Its coverage at 5 000 and
# 50 000 units: benchmarks/coverage.py --large.
EDGEWORTH_MEAN_UNITS = 5000


def mean_interval(units, confidence: float = 0.95, *, rng_seed: int = 0,
                  n_resamples: int = 1999) -> list[float] | None:
    """Bootstrap-t (studentised bootstrap) interval of the mean over independent units (per-cycle means when
    ports share a cycle); None below 2 units. The Student-t interval under-covers skewed delays at small n
    (90.5 % at 10 cycles of a lognormal σ 0.6); the studentised bootstrap holds ±3 pp of nominal there and on
    the bench-like models (benchmarks/coverage.py). scipy.stats.bootstrap has no studentised method. None
    below MIN_MEAN_UNITS units; from EDGEWORTH_MEAN_UNITS units the resampled quantiles' expansion instead."""
    x = np.asarray(units, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < MIN_MEAN_UNITS:
        return None
    if np.ptp(x) == 0:
        return [float(x[0]), float(x[0])]
    n = x.size
    mean, se = x.mean(), x.std(ddof=1) / np.sqrt(n)
    if n >= EDGEWORTH_MEAN_UNITS:
        return _expanded_t_interval(mean, se, _third_cumulant_of_mean(x) / se ** 3, confidence)
    means, variances = _resampled_moments(x, np.random.default_rng(rng_seed), n_resamples)
    se_star = np.sqrt(variances / n)
    keep = se_star > 0                      # a resample of one repeated value has no studentised statistic
    return _resampled_t_interval(mean, se, (means[keep] - mean) / se_star[keep], confidence)


def _resampled_moments(x: np.ndarray, rng: np.random.Generator, n_resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of `n_resamples` resamples' mean and variance (ddof 1). Drawn a block of resamples at a time (one block
    holds them all up to ~520 units: the same draws as all at once), so a campaign of 10^5 cycles needs ~8 MiB here,
    not 1999 x 10^5 values."""
    n = x.size
    rows = max(1, min(n_resamples, _RESAMPLE_VALUES // n))
    means, variances = np.empty(n_resamples), np.empty(n_resamples)
    for start in range(0, n_resamples, rows):
        resampled = x[rng.integers(0, n, size=(min(rows, n_resamples - start), n))]
        means[start:start + len(resampled)] = resampled.mean(axis=1)
        variances[start:start + len(resampled)] = resampled.var(axis=1, ddof=1)
    return means, variances


def _resampled_t_interval(estimate: float, se: float, t_star: np.ndarray, confidence: float) -> list[float]:
    alpha = 1.0 - confidence
    lo_q, hi_q = np.quantile(t_star, [alpha / 2, 1 - alpha / 2])
    return [float(estimate - hi_q * se), float(estimate - lo_q * se)]


def _third_cumulant_of_mean(x: np.ndarray) -> float:
    """κ3 of the sample mean, μ3 / n², μ3 estimated without bias (k-statistic)."""
    return float(stats.kstat(x, 3)) / x.size ** 2


def _expanded_t_interval(estimate: float, se: float, skew: float, confidence: float) -> list[float]:
    """The bootstrap-t interval with the studentised statistic's quantiles from their one-term Edgeworth
    (Cornish-Fisher) expansion, P(T ≤ t) = Φ(t) + s (2t² + 1) φ(t) / 6 + O(1/n), `skew` s the estimate's own
    skewness (κ3 / σ³: γ / √n for one mean): right-skewed delays give a left-skewed T, so the interval reaches
    further above the estimate than below it, as the resampled one does."""
    z = stats.norm.ppf([(1 - confidence) / 2, (1 + confidence) / 2])
    t = z - skew * (2 * z ** 2 + 1) / 6
    return [float(estimate - t[1] * se), float(estimate - t[0] * se)]


def mean_difference_interval(a_units, b_units, confidence: float = 0.95, *, rng_seed: int = 0,
                             n_resamples: int = 1999) -> list[float] | None:
    """Interval of mean(b) − mean(a) over two independent sets of units (per-cycle values of two runs): the
    two-sample studentised bootstrap of Welch's statistic (each run resampled within itself), as
    `mean_interval` is for one, and as it from EDGEWORTH_MEAN_UNITS units a side the expansion (the difference's
    κ3 = κ3(mean b) − κ3(mean a)). None below MIN_DIFFERENCE_UNITS units on either side. Coverage:
    benchmarks/coverage_difference.py."""
    a, b = (np.asarray(u, dtype=float) for u in (a_units, b_units))
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < MIN_DIFFERENCE_UNITS or b.size < MIN_DIFFERENCE_UNITS:
        return None
    diff = b.mean() - a.mean()
    se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    if se == 0:
        return [float(diff), float(diff)]
    if min(a.size, b.size) >= EDGEWORTH_MEAN_UNITS:
        return _expanded_t_interval(diff, se, (_third_cumulant_of_mean(b) - _third_cumulant_of_mean(a)) / se ** 3,
                                    confidence)
    rng = np.random.default_rng(rng_seed)
    mean_a, var_a = _resampled_moments(a, rng, n_resamples)
    mean_b, var_b = _resampled_moments(b, rng, n_resamples)
    se_star = np.sqrt(var_a / a.size + var_b / b.size)
    keep = se_star > 0
    return _resampled_t_interval(diff, se, (mean_b[keep] - mean_a[keep] - diff) / se_star[keep], confidence)


def cycle_units(events: pd.DataFrame) -> dict[str, np.ndarray]:
    """One value per measured cycle for every up-stage delay (the mean over the cycle's ports), the OCS
    switch time and the turnaround, in the events' units: what two runs are compared by."""
    measured = events[events["cycle"] > 0]
    table = stage_table(measured)
    out = {"ocs_switch": ocs_switch_times(measured).to_numpy()}
    for stage in UP_STAGES[1:]:
        column = table[stage].dropna()
        out[stage] = column.groupby(level="cycle").mean().to_numpy() if len(column) else np.array([])
    out["turnaround"] = turnaround(measured).to_numpy()
    return out


def summarize(samples, rng_seed: int, *, cycles=None, confidence: float = 0.95) -> dict:
    """n, n_cycles, mean, p50, p90, p99, max, and intervals whose unit is the cycle.

    `cycles` (aligned with `samples`) says which cycle each sample came from; without it every sample is
    one independent unit (a per-cycle quantity such as turnaround). The mean's interval is a bootstrap-t
    interval over per-cycle means; the p99's is an order-statistic interval over one port drawn per cycle (the ports of a
    cycle share one OCS draw, so only cycles are independent). Where the cycles are too few for a two-sided
    p99 interval, `p99_ci95` is None, `p99_needs_cycles` says how many would do and `p99_bound95` holds the
    one-sided bounds the data support; likewise `mean_ci95` is None below MIN_MEAN_UNITS cycles.
    """
    x = np.asarray(samples, dtype=float)
    c = _units(x, cycles)
    keep = np.isfinite(x)
    x = x[keep]
    n = int(x.size)
    nan = float("nan")
    if n == 0:
        return {"n": 0, "n_cycles": 0, "mean": nan, "p50": nan, "p90": nan, "p99": nan, "max": nan,
                "mean_ci95": None, "p99_ci95": None, "p99_needs_cycles": quantile_needs_n(0.99, confidence),
                "p99_bound95": {"lower": None, "upper": None}}
    if c is None:
        units_mean = units_quantile = x
    else:
        c = c[keep]
        units_mean = cycle_means(x, c)
        units_quantile = one_per_cycle(x, c, np.random.default_rng(rng_seed))
    p50, p90, p99 = np.quantile(x, [0.5, 0.9, 0.99])
    q = quantile_interval(units_quantile, 0.99, confidence)
    return {"n": n, "n_cycles": int(len(units_mean)), "mean": float(x.mean()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99), "max": float(x.max()),
            "mean_ci95": mean_interval(units_mean, confidence, rng_seed=rng_seed), "p99_ci95": q["ci"],
            "p99_needs_cycles": q["needs_n"], "p99_bound95": {"lower": q["lower"], "upper": q["upper"]}}


def mean_interval_text(s: dict, unit: str = "", digits: int = 3) -> str:
    """How a summary's mean interval reads in a report (`digits` decimals): the interval, or how many cycles it
    needs."""
    ci = s.get("mean_ci95")
    if ci is not None:
        return f"{ci[0]:.{digits}f}–{ci[1]:.{digits}f}{unit}"
    return f"needs ≥ {MIN_MEAN_UNITS} cycles" if s.get("n") else "–"


def p99_interval_text(s: dict, unit: str = "", digits: int = 3) -> str:
    """How a summary's p99 interval reads in a report: the interval, or what n it needs and the bound held."""
    if s.get("p99_ci95") is not None:
        lo, hi = s["p99_ci95"]
        return f"{lo:.{digits}f}–{hi:.{digits}f}{unit}"
    if not s.get("n"):
        return "–"
    text = f"p99 needs ≥ {s['p99_needs_cycles']} cycles"
    lower = (s.get("p99_bound95") or {}).get("lower")
    if lower is not None:
        text += f"; p99 ≥ {lower:.{digits}f}{unit}"
    return text


def cycle_tables(events: pd.DataFrame) -> dict:
    """What `summarize_events` needs of `events`, per cycle: the stage table, the OCS switch time per cycle and
    the number of cycles. Tables of disjoint sets of cycles, in cycle order, summarise as their events would
    together (`summarize_cycle_tables`): a long campaign is read a block of cycles at a time."""
    cycles = _cycle_times(events)
    return {"table": stage_table(events, cycles), "ocs_switch": ocs_switch_times(events, cycles),
            "cycles": int(events["cycle"].nunique()) if len(events) else 0}


def summarize_events(events: pd.DataFrame, rng_seed: int, *, scale: float = 1e-6) -> dict:
    """Summaries of every stage delay, chain duration, OCS switch time and turnaround.

    Per-port rows are summarised with their cycles as the unit of replication; the OCS switch time and the
    turnaround are per-cycle quantities, counted once per cycle. `scale` converts event units to report
    units (default ns → ms).
    """
    return summarize_cycle_tables([cycle_tables(events)], rng_seed, scale=scale)


def summarize_cycle_tables(parts: list[dict], rng_seed: int, *, scale: float = 1e-6) -> dict:
    """`summarize_events` over the `cycle_tables` of blocks of cycles (disjoint, in cycle order)."""
    columns = [cycle_columns(p) for p in parts]
    return summarize_columns(lambda name: np.concatenate([c[name] for c in columns]),
                             sum(p["cycles"] for p in parts), rng_seed, scale=scale)


def cycle_columns(part: dict) -> dict[str, np.ndarray]:
    """A `cycle_tables` part as the flat columns `summarize_columns` reads: per row (cycle, host, port) its
    "cycle" and every delay column of the stage table; per cycle "ocs_switch" and "turnaround". The columns of
    disjoint blocks of cycles, in cycle order and each concatenated, are those of the blocks' events together."""
    table = part["table"]
    turn = table["first_packet"].groupby(level="cycle").max().dropna() if len(table) else pd.Series([], dtype="float64")
    out = {"cycle": table.index.get_level_values("cycle").to_numpy().astype("int64", copy=False),
           "ocs_switch": part["ocs_switch"].to_numpy(dtype="float64"), "turnaround": turn.to_numpy(dtype="float64")}
    for name in list(UP_STAGES[1:]) + [f"chain_{name}" for name in CHAIN]:
        out[name] = table[name].to_numpy(dtype="float64")
    return out


def summarize_columns(column, cycles: int, rng_seed: int, *, scale: float = 1e-6) -> dict:
    """`summarize_cycle_tables` from the `cycle_columns` of a run, `column(name)` giving one whole column at a time
    (read from disk at a campaign's end: only one column and the row cycles are held at once)."""
    row_cycles = column("cycle")
    out = {"unit_scale": scale, "stages": {}, "chain": {}}
    per_cycle_ocs = column("ocs_switch")
    for i, stage in enumerate(UP_STAGES):
        if stage == "ocs_command_completed":  # one value per cycle, not one per port
            out["stages"][stage] = summarize(per_cycle_ocs * scale, rng_seed + i)
        else:
            out["stages"][stage] = summarize(column(stage) * scale, rng_seed + i, cycles=row_cycles)
    for i, name in enumerate(CHAIN):
        out["chain"][name] = summarize(column(f"chain_{name}") * scale, rng_seed + 100 + i, cycles=row_cycles)
    out["ocs_switch"] = summarize(per_cycle_ocs * scale, rng_seed + 200)
    out["turnaround"] = summarize(column("turnaround") * scale, rng_seed + 300)
    out["cycles"] = cycles
    return out
