"""Per-stage delay tables and summaries with bootstrap confidence intervals. Pure: DataFrames in, numbers out.

Conventions:
- A cycle's reference time is its earliest `ocs_command_sent`; its `ocs_command_completed` is the latest
  completion (a cycle may drive several switches).
- Per port (host, port) the first event of each stage in a cycle counts (later repeats are flaps).
- Delays are in the events' unit (ns); missing stages give NaN.
- Stage-delay columns are named by stage; chain-duration columns are `chain_<name>` (CHAIN).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

UP_STAGES = ("ocs_command_completed", "light_detected", "cdr_locked", "phy_up", "port_active", "first_packet")
NIC_STAGES = ("light_detected", "cdr_locked", "phy_up", "port_active", "first_packet", "light_lost", "port_down")
# Per-port chain durations: name -> (later stage, earlier stage). Names match the timing-profile keys.
CHAIN = {
    "los_clear": ("light_detected", "ocs_command_completed"),
    "cdr_lock": ("cdr_locked", "light_detected"),
    "phy_up": ("phy_up", "cdr_locked"),
    "port_active": ("port_active", "phy_up"),
    "first_packet": ("first_packet", "port_active"),
    "link_down": ("port_down", "light_lost"),
}


def _cycle_times(events: pd.DataFrame) -> pd.DataFrame:
    """Per cycle: ocs_command_sent (earliest) and ocs_command_completed (latest)."""
    ocs = events[events["stage"].isin(["ocs_command_sent", "ocs_command_completed"])]
    sent = ocs[ocs["stage"] == "ocs_command_sent"].groupby("cycle")["t_ns"].min()
    done = ocs[ocs["stage"] == "ocs_command_completed"].groupby("cycle")["t_ns"].max()
    return pd.DataFrame({"ocs_command_sent": sent, "ocs_command_completed": done}).astype("float64")


def port_stage_times(events: pd.DataFrame) -> pd.DataFrame:
    """Absolute stage times, one row per (cycle, host, port), one column per NIC stage (first occurrence)."""
    nic = events[events["stage"].isin(NIC_STAGES)]
    wide = (nic.groupby(["cycle", "host", "port", "stage"], observed=True)["t_ns"].min()
            .unstack("stage"))
    wide = wide.reindex(columns=list(NIC_STAGES)).astype("float64")
    wide.columns.name = None
    return wide


def stage_table(events: pd.DataFrame) -> pd.DataFrame:
    """Per (cycle, host, port): each up-stage's delay after the cycle's ocs_command_sent, plus the chain
    durations (CHAIN, columns `chain_<name>`) between consecutive stages."""
    cycles = _cycle_times(events)
    ports = port_stage_times(events)
    if ports.empty:
        columns = list(UP_STAGES) + [f"chain_{name}" for name in CHAIN]
        index = pd.MultiIndex.from_arrays([[], [], []], names=["cycle", "host", "port"])
        return pd.DataFrame(index=index, columns=columns, dtype="float64")
    cycle_of_row = ports.index.get_level_values("cycle")
    sent = cycles["ocs_command_sent"].reindex(cycle_of_row).to_numpy()
    done = cycles["ocs_command_completed"].reindex(cycle_of_row).to_numpy()
    table = pd.DataFrame(index=ports.index)
    table["ocs_command_completed"] = done - sent
    for stage in UP_STAGES[1:]:
        table[stage] = ports[stage].to_numpy() - sent
    absolute = ports.copy()
    absolute["ocs_command_completed"] = done
    for name, (later, earlier) in CHAIN.items():
        table[f"chain_{name}"] = absolute[later].to_numpy() - absolute[earlier].to_numpy()
    return table


def ocs_switch_times(events: pd.DataFrame) -> pd.Series:
    """Per cycle: latest ocs_command_completed − earliest ocs_command_sent."""
    cycles = _cycle_times(events)
    return (cycles["ocs_command_completed"] - cycles["ocs_command_sent"]).dropna().rename("ocs_switch")


def turnaround(events: pd.DataFrame) -> pd.Series:
    """Per cycle: max over ports of first_packet − ocs_command_sent (NaN-free: cycles lacking either drop)."""
    table = stage_table(events)
    if table.empty:
        return pd.Series([], dtype="float64", name="turnaround")
    per_cycle = table["first_packet"].groupby(level="cycle").max()
    return per_cycle.dropna().rename("turnaround")


def summarize(samples, rng_seed: int, *, n_resamples: int = 2000, confidence: float = 0.95) -> dict:
    """n, mean, p50, p90, p99, max, and percentile-bootstrap CIs of the mean and the p99."""
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        nan = float("nan")
        return {"n": 0, "mean": nan, "p50": nan, "p90": nan, "p99": nan, "max": nan,
                "mean_ci95": [nan, nan], "p99_ci95": [nan, nan]}
    p50, p90, p99 = np.quantile(x, [0.5, 0.9, 0.99])
    rng = np.random.default_rng(rng_seed)
    means = np.empty(n_resamples)
    p99s = np.empty(n_resamples)
    chunk = max(1, min(n_resamples, 4_000_000 // n))  # bound memory: chunk × n indices at a time
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        resampled = x[rng.integers(0, n, size=(stop - start, n))]
        means[start:stop] = resampled.mean(axis=1)
        p99s[start:stop] = np.quantile(resampled, 0.99, axis=1)
    tail = (1 - confidence) / 2
    levels = [tail, 1 - tail]
    return {"n": n, "mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(x.max()),
            "mean_ci95": [float(v) for v in np.quantile(means, levels)],
            "p99_ci95": [float(v) for v in np.quantile(p99s, levels)]}


def summarize_events(events: pd.DataFrame, rng_seed: int, *, scale: float = 1e-6) -> dict:
    """Summaries of every stage delay, chain duration, OCS switch time and turnaround.

    `scale` converts event units to report units (default ns → ms).
    """
    table = stage_table(events)
    out = {"unit_scale": scale, "stages": {}, "chain": {}}
    for i, stage in enumerate(UP_STAGES):
        out["stages"][stage] = summarize(table[stage].to_numpy() * scale, rng_seed + i)
    for i, name in enumerate(CHAIN):
        out["chain"][name] = summarize(table[f"chain_{name}"].to_numpy() * scale, rng_seed + 100 + i)
    out["ocs_switch"] = summarize(ocs_switch_times(events).to_numpy() * scale, rng_seed + 200)
    out["turnaround"] = summarize(turnaround(events).to_numpy() * scale, rng_seed + 300)
    out["cycles"] = int(events["cycle"].nunique()) if len(events) else 0
    return out
