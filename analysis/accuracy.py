"""Recorded events against emulator ground truth. Pure: DataFrames in, numbers out."""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from analysis.keys import Keys, equals, first_of_groups

KEY = ["cycle", "stage", "host", "port"]


class CycleIndex:
    """Each time's cycle: the one whose start is the latest at or before it (`cycle_starts`: [(cycle, start_ns),
    ...]); -2**63 for a time before the first start. Sorted once, for a campaign's many chunks of times."""

    def __init__(self, cycle_starts: list[tuple[int, int]]):
        starts = sorted(cycle_starts, key=lambda cs: cs[1])
        self.times = np.array([s for _, s in starts], dtype=np.int64)
        self.cycles = np.array([c for c, _ in starts] + [np.iinfo(np.int64).min], dtype=np.int64)

    def __call__(self, t_ns: np.ndarray) -> np.ndarray:
        t_ns = np.asarray(t_ns, dtype=np.int64)
        return self.cycles[np.searchsorted(self.times, t_ns, side="right") - 1]  # index -1: before the first start


def cycle_of(t_ns: np.ndarray, cycle_starts: list[tuple[int, int]]) -> np.ndarray:
    """`CycleIndex(cycle_starts)(t_ns)`."""
    return CycleIndex(cycle_starts)(t_ns)


def assign_cycles(truth: pd.DataFrame, cycle_starts: list[tuple[int, int]]) -> pd.DataFrame:
    """Give each truth row (t_ns) the cycle whose start is the latest at or before it; rows before the first
    start are dropped. `cycle_starts` is [(cycle, start_ns), ...]."""
    if truth.empty or not cycle_starts:
        return truth.assign(cycle=pd.Series(dtype="int64")).iloc[0:0]
    cycle = cycle_of(truth["t_ns"].to_numpy(dtype=np.int64), cycle_starts)
    keep = cycle != np.iinfo(np.int64).min
    out = truth.loc[keep].copy()
    out["cycle"] = cycle[keep]
    return out


def match(events: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """First recorded event and first true event per (cycle, stage, host, port); error = recorded − true.
    Covered: the recorded bound meets the truth's — the truth is a point unless the frame has `truth_halfwidth_ns`
    (an emulator that knows a change only to within a window: sshd hosts' kernel and file changes). Rows in KEY's
    order; the recorded uncertainty is the key's first row's."""
    keys = Keys([events, truth], KEY)
    rec, rec_starts = first_of_groups(keys.codes[0], keys.valid[0])
    t = events["t_ns"].to_numpy(np.int64)
    t_rec = np.minimum.reduceat(t[rec], rec_starts) if len(rec) else t[:0]
    rec = rec[rec_starts]
    true_t = truth["t_ns"].to_numpy(np.int64)
    tru, tru_starts = first_of_groups(keys.codes[1], keys.valid[1], by=true_t)
    tru = tru[tru_starts]  # the earliest true row of each key
    _, on_rec, on_tru = np.intersect1d(keys.codes[0][rec], keys.codes[1][tru], assume_unique=True,
                                       return_indices=True)
    rows = rec[on_rec]
    joined = events[KEY].iloc[rows].reset_index(drop=True)
    joined["t_ns"] = t_rec[on_rec]
    joined["uncertainty_ns"] = events["uncertainty_ns"].to_numpy()[rows]
    joined["true_ns"] = true_t[tru[on_tru]]
    if "truth_halfwidth_ns" in truth:
        joined["truth_halfwidth_ns"] = truth["truth_halfwidth_ns"].to_numpy()[tru[on_tru]]
    joined["error_ns"] = joined["t_ns"] - joined["true_ns"]
    slack = joined["truth_halfwidth_ns"] if "truth_halfwidth_ns" in joined else 0
    joined["covered"] = joined["error_ns"].abs() <= joined["uncertainty_ns"] + slack
    return joined


def watched_truth(truth: pd.DataFrame, watched_until: dict[int, int] | pd.Series) -> pd.DataFrame:
    """The first true event per (cycle, stage, host, port) that happened while its cycle was watched: at or
    before `watched_until[cycle]` (harness ns the cycle stopped watching; a cycle not in it was not watched). A
    caller with many cycles passes them as a Series (a dict is made one on every call)."""
    keys = Keys([truth], KEY)
    t = truth["t_ns"].to_numpy(np.int64)
    order, starts = first_of_groups(keys.codes[0], keys.valid[0], by=t)
    first = truth[KEY].iloc[order[starts]].reset_index(drop=True)
    first["t_ns"] = t[order[starts]]
    until = first["cycle"].map(watched_until)
    return first[until.notna() & (first["t_ns"] <= until)].reset_index(drop=True)


def unrecorded(events: pd.DataFrame, watched: pd.DataFrame) -> pd.DataFrame:
    """The rows of `watched` (`watched_truth`) with no recorded event of the same (cycle, stage, host, port):
    true events the harness lost — unless its cycle's faults name them."""
    keys = Keys([events, watched], KEY)
    return watched.loc[~np.isin(keys.codes[1], keys.codes[0])].reset_index(drop=True)


def clock_sample_errors(samples: pd.DataFrame, clocks: dict[str, dict]) -> pd.DataFrame:
    """Each kept clock sample (host, t_ns, offset_ns, delay_ns, uncertainty_ns: observations.jsonl's "clock"
    records) against its host's true offset at t_ns — an emulated clock's `epoch_ns + offset_ns + drift_ppm·1e-6·
    (t − t0_ns)` (`host_clock_params`): error_ns = offset − true, covered = |error| ≤ uncertainty. Hosts
    without truth are left out."""
    rows = samples[samples["host"].isin(list(clocks))].copy()
    params = pd.DataFrame.from_dict(clocks, orient="index").reindex(rows["host"])
    t = rows["t_ns"].to_numpy(dtype=np.int64)
    drift = np.trunc(params["drift_ppm"].to_numpy(dtype=float) * 1e-6 * (t - params["t0_ns"].to_numpy(dtype=np.int64)))
    true = params["epoch_ns"].to_numpy(dtype=np.int64) + params["offset_ns"].to_numpy(dtype=np.int64) + \
        drift.astype(np.int64)
    rows["error_ns"] = rows["offset_ns"].to_numpy(dtype=np.int64) - true
    rows["covered"] = np.abs(rows["error_ns"]) <= rows["uncertainty_ns"]
    return rows.reset_index(drop=True)


# What an emulated switch records of each command (physics ground truth, host "ocs"): when a command that moves a
# mirror reached it, and when each mirror settled. The harness records none of these as such; they bound its
# OCS events (`ocs_command_check`).
OCS_TRUTH_STAGES = ("ocs_command_arrived", "mirror_settled")


def ocs_command_check(events: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """Per cycle, the recorded OCS command against the switch's own record (`truth`: OCS_TRUTH_STAGES rows with
    their cycle). `transit_ns` = the cycle's first arrival of a changing command − its recorded send
    (`ocs_command_sent`, the first changing command's); `causal`: the send's lower bound (t − uncertainty) is
    not after that arrival — a send stamped after the switch had the command would shift every turnaround of the
    cycle (`arrived_by`: the truth row's `port`, how the switch dated the arrival: "kernel", or "handled" when it
    had no stamp). `settled_to_completed_ns` = the recorded completion − the cycle's last mirror settling;
    `completed_before_settled`: the completion's upper bound is before it (a switch that answers once its mirrors
    settled, as the emulated TL1 one, never does). Cycles without a send and an arrival are left out."""
    def per_cycle(frame: pd.DataFrame, stage: str, how: str, **first: str) -> pd.DataFrame:
        """The rows of `stage`, per cycle: t_ns reduced by `how` ("min", "max", or "first": the earliest, ties in
        row order), and for each `first` column its value in the cycle's first row (row order; "first": the
        earliest row's)."""
        cycle, t = frame["cycle"].to_numpy(np.int64), frame["t_ns"].to_numpy(np.int64)
        order, starts = first_of_groups(cycle, equals(frame["stage"], stage), by=t if how == "first" else None)
        reduce = {"min": np.minimum, "max": np.maximum}.get(how)
        columns = {f"{stage}_ns": (reduce.reduceat(t[order], starts) if len(order) else t[:0]) if reduce else
                   t[order[starts]]}
        columns.update({name: frame[column].array[order[starts]] for name, column in first.items()})
        return pd.DataFrame(columns, index=pd.Index(cycle[order[starts]], name="cycle"))

    arrived = per_cycle(truth, "ocs_command_arrived", "first", arrived_by="port") \
        .rename(columns={"ocs_command_arrived_ns": "arrived_ns"})
    settled = per_cycle(truth, "mirror_settled", "max")["mirror_settled_ns"].rename("settled_ns")
    out = per_cycle(events, "ocs_command_sent", "min", ocs_command_sent_bound_ns="uncertainty_ns") \
        .join(arrived, how="inner") \
        .join(per_cycle(events, "ocs_command_completed", "max", ocs_command_completed_bound_ns="uncertainty_ns")) \
        .join(settled)
    out = out.rename(columns={"ocs_command_sent_ns": "sent_ns", "ocs_command_sent_bound_ns": "sent_bound_ns",
                              "ocs_command_completed_ns": "completed_ns",
                              "ocs_command_completed_bound_ns": "completed_bound_ns"})
    out["transit_ns"] = out["arrived_ns"] - out["sent_ns"]
    out["causal"] = out["sent_ns"] - out["sent_bound_ns"] <= out["arrived_ns"]
    out["settled_to_completed_ns"] = out["completed_ns"] - out["settled_ns"]
    # NaN (a cycle without a completion or a settling mirror) compares False: not counted as before
    out["completed_before_settled"] = out["completed_ns"] + out["completed_bound_ns"] < out["settled_ns"]
    return out.reset_index()


def ocs_command_table(check: pd.DataFrame) -> dict:
    """`ocs_command_check` in a few numbers (ms): n cycles, how their arrivals were dated (`arrived_by`: the switch's
    "kernel" receive stamp, or when it "handled" the command — later, so those transits are upper bounds),
    transit p50 / p99 / max, sends not causal, and the completion after the last mirror settled, p50 / p99 (over
    the cycles that have both), and how many came before it."""
    counts, transit, after = ocs_command_parts(check)
    return ocs_command_numbers(counts, transit, after)


def ocs_command_parts(check: pd.DataFrame) -> tuple[dict, np.ndarray, np.ndarray]:
    """What `ocs_command_numbers` needs of an `ocs_command_check` table: its counts (`add_counts` adds those of
    disjoint blocks of cycles), the transits and the completions after the last settling (ns, the blocks' values
    concatenated in cycle order)."""
    by = check["arrived_by"].value_counts(sort=False)
    counts = {"n": int(len(check)), "arrived_by": {str(k): int(v) for k, v in by.items()},
              "not_causal": int((~check["causal"]).sum()),
              "completed_before_settled": int(check["completed_before_settled"].sum())}
    return (counts, check["transit_ns"].to_numpy(dtype=float),
            check["settled_to_completed_ns"].dropna().to_numpy(dtype=float))


def add_counts(total: dict, counts: dict) -> dict:
    """Counts (ints, or dicts of them, as `ocs_command_parts` gives) added key by key, in the order first seen."""
    for key, value in counts.items():
        if isinstance(value, dict):
            add_counts(total.setdefault(key, {}), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


def ocs_command_numbers(counts: dict, transit_ns: np.ndarray, after_ns: np.ndarray) -> dict:
    """`ocs_command_table` from `ocs_command_parts` (of a whole run)."""
    transit, after = transit_ns / 1e6, after_ns / 1e6
    q = lambda v, p: float(np.quantile(v, p)) if len(v) else float("nan")  # noqa: E731
    return {"n": counts["n"], "arrived_by": counts["arrived_by"],
            "transit_p50_ms": q(transit, 0.5), "transit_p99_ms": q(transit, 0.99),
            "transit_max_ms": float(transit.max()) if len(transit) else float("nan"),
            "not_causal": counts["not_causal"], "settled_to_completed_n": int(len(after)),
            "completed_before_settled": counts["completed_before_settled"],
            "settled_to_completed_p50_ms": q(after, 0.5), "settled_to_completed_p99_ms": q(after, 0.99)}


def accuracy_table(matched: pd.DataFrame) -> pd.DataFrame:
    """Per stage: n, p50 and p99 of |error| (ms), mean error (bias, ms), coverage of ±uncertainty."""
    groups = list(matched.groupby("stage", observed=True)) + [("all", matched)]
    return accuracy_rows((stage, lambda g=g: (g["error_ns"].to_numpy(copy=True), g["covered"].to_numpy()))
                         for stage, g in groups)


def _as_float(values: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """int64 values as float64 in their own buffer, a chunk at a time (a campaign's matched errors: ~10^7)."""
    out = values.view(np.float64)
    for at in range(0, len(values), chunk):
        out[at:at + chunk] = values[at:at + chunk].copy()
    return out


def accuracy_rows(stages) -> pd.DataFrame:
    """`accuracy_table` from (stage, read) pairs, "all" last, `read()` giving that stage's matched error_ns (int64)
    and covered (bool) as whole arrays (read from disk at a campaign's end: one stage held at a time; error_ns is
    overwritten)."""
    rows = []
    for stage, read in stages:
        error_ns, covered = read()
        if len(error_ns) == 0:
            continue
        bias_ms = float(pd.Series(error_ns, copy=False).mean() / 1e6)
        err = np.abs(error_ns).astype(float) if error_ns.dtype != np.int64 else _as_float(np.abs(error_ns, out=error_ns))
        del error_ns
        err /= 1e6
        p50, p99 = np.quantile(err, [0.5, 0.99], overwrite_input=True)
        rows.append({"stage": stage, "n": len(err), "abs_err_p50_ms": float(p50), "abs_err_p99_ms": float(p99),
                     "bias_ms": bias_ms, "coverage": float(pd.Series(covered, copy=False).mean())})
    return pd.DataFrame(rows)


LATE_FLOOR_MS = 0.1        # below this an action ran on time, whatever its stage
LATE_REL_TOLERANCE = 0.05  # ... and below this share of its stage's p99 delay


def late_threshold_ms(stage_p99_ms, floor_ms: float = LATE_FLOOR_MS, rel_tolerance: float = LATE_REL_TOLERANCE):
    """The lateness beyond the profile's resolution: max(floor, rel_tolerance × the stage's p99 delay)."""
    return np.maximum(floor_ms, rel_tolerance * np.asarray(stage_p99_ms, dtype=float))


def late_cycles(draws: pd.DataFrame, cycle_starts: list[tuple[int, int]], *, floor_ms: float = LATE_FLOOR_MS,
                rel_tolerance: float = LATE_REL_TOLERANCE, stages: tuple[str, ...] | None = None) -> list[dict]:
    """Recorded cycles (> 0) in which the emulated bench realised a drawn delay later than drawn by more than the
    profile's resolution (`late_threshold_ms` of the stage; the stage's p99 over the run's draws).

    `draws`: stage, port, delay_ns, late_ns (how much later than drawn it was realised:
    devices.emulated.schedule), due_ns (-1: never ran); a draw belongs to the cycle its due time falls in
    (`assign_cycles`). `stages`: judge only the draws of these stages (None: all). One row per late cycle, in
    cycle order: cycle, late_ms (its latest draw), stage and port of that draw, threshold_ms."""
    if stages is not None:
        draws = draws[draws["stage"].isin(stages)]
    if draws.empty:
        return []
    p99_ms = draws.groupby("stage")["delay_ns"].quantile(0.99) / 1e6
    ran = assign_cycles(draws[draws["due_ns"] >= 0].rename(columns={"due_ns": "t_ns"}), cycle_starts)
    ran = ran.assign(late_ms=ran["late_ns"] / 1e6,
                     threshold_ms=late_threshold_ms(p99_ms.reindex(ran["stage"]).to_numpy()
                                                    if len(ran) else [], floor_ms, rel_tolerance))
    late = ran[(ran["late_ms"] > ran["threshold_ms"]) & (ran["cycle"] > 0)]
    worst = late.sort_values(["cycle", "late_ms"], ascending=[True, False]).drop_duplicates("cycle")
    return [{"cycle": int(r.cycle), "late_ms": float(r.late_ms), "stage": str(r.stage), "port": str(r.port),
             "threshold_ms": float(r.threshold_ms)} for r in worst.itertuples(index=False)]


def realised_vs_profile(draws: pd.DataFrame, *, alpha: float = 0.01, floor_ms: float = LATE_FLOOR_MS,
                        rel_tolerance: float = LATE_REL_TOLERANCE) -> dict:
    """Did the emulator keep its profile? Per stage, the delays it drew against those it realised.

    `draws` has one row per drawn delay: stage, delay_ns, late_ns (how much later than drawn the bench
    realised it) and u_realised — the profile's CDF at the realised delay (delay + late), NaN for a fixed delay.
    The realised delays follow the profile iff u_realised is uniform (a KS test per stage). A stage missed
    its profile when the test rejects at `alpha` (or the delay is fixed) and the p99 lateness exceeds
    max(floor_ms, rel_tolerance × the stage's p99): a machine too busy to keep the profile.
    """
    return stages_vs_profile({stage: stage_vs_profile(g["delay_ns"].to_numpy(), g["late_ns"].to_numpy(),
                                                      g["u_realised"].to_numpy(dtype=float), alpha=alpha,
                                                      floor_ms=floor_ms, rel_tolerance=rel_tolerance)
                              for stage, g in draws.groupby("stage", sort=False)})


def stage_vs_profile(delay_ns: np.ndarray, late_ns: np.ndarray, u: np.ndarray, *, alpha: float = 0.01,
                     floor_ms: float = LATE_FLOOR_MS, rel_tolerance: float = LATE_REL_TOLERANCE) -> dict:
    """One stage's row of `realised_vs_profile` from its draws' delays, lateness and u_realised (one stage at a
    time: a campaign draws ~10^6 delays a stage)."""
    drawn = np.asarray(delay_ns, dtype=float) / 1e6
    late = np.asarray(late_ns, dtype=float) / 1e6
    u = np.asarray(u, dtype=float)
    ks_p = float(stats.kstest(u, "uniform").pvalue) if np.isfinite(u).all() and len(u) >= 2 else None
    d50, d99 = np.quantile(drawn, [0.5, 0.99])
    r50, r99 = np.quantile(drawn + late, [0.5, 0.99])
    late99 = float(np.quantile(late, 0.99))
    missed = (ks_p is None or ks_p < alpha) and late99 > late_threshold_ms(d99, floor_ms, rel_tolerance)
    return {"n": int(len(drawn)), "profile_p50_ms": float(d50), "profile_p99_ms": float(d99),
            "realised_p50_ms": float(r50), "realised_p99_ms": float(r99), "late_p99_ms": late99,
            "late_max_ms": float(late.max()), "ks_p": ks_p, "missed": bool(missed)}


def stages_vs_profile(stages: dict[str, dict]) -> dict:
    """`realised_vs_profile`'s report from its rows per stage (`stage_vs_profile`), in their order."""
    out = {"stages": dict(stages), "late": [s for s, r in stages.items() if r["missed"]], "warning": None}
    if out["late"]:
        worst = max(out["late"], key=lambda s: out["stages"][s]["late_p99_ms"])
        w = out["stages"][worst]
        ks = "" if w["ks_p"] is None else f", KS p = {w['ks_p']:.2g}"
        out["warning"] = (f"the machine made the emulator late in {len(out['late'])} stage(s) "
                          f"({', '.join(out['late'])}): {worst} realised p99 {w['realised_p99_ms']:.3f} ms against "
                          f"the profile's {w['profile_p99_ms']:.3f} ms{ks}; lateness p99 {w['late_p99_ms']:.3f} ms")
    return out
