"""The numpy groupings of a campaign's end (analysis.keys) against pandas' groupby and merge on the same frames: the
same rows, values, order and dtypes, with missing keys, tied times, unsorted rows and mixed string dtypes."""
import numpy as np
import pandas as pd
import pytest

from analysis.accuracy import KEY, match, ocs_command_check, unrecorded, watched_truth
from analysis.keys import Keys, first_of_groups
from analysis.stats import NIC_STAGES, port_stage_times


def frame(rng, n, *, dtype="string", stages=("light_detected", "phy_up", "port_active", "ocs_command_sent")):
    hosts = np.array(["gpu1", "gpu10", "gpu2", None], dtype=object)
    out = pd.DataFrame({
        "cycle": rng.integers(3, 9, n),
        "stage": rng.choice(np.array(stages, dtype=object), n),
        "host": hosts[rng.choice(4, n, p=[0.35, 0.3, 0.3, 0.05])],
        "port": rng.choice(np.array(["ens1", "ens2", "ens10"], dtype=object), n),
        "t_ns": rng.integers(0, 40, n) * 1000,  # few distinct times: many ties
        "uncertainty_ns": rng.integers(1, 30_000, n)})
    return out.astype({k: dtype for k in ("stage", "host", "port")})


def reference_match(events, truth):
    rec = events.groupby(KEY, observed=True).agg(t_ns=("t_ns", "min"), uncertainty_ns=("uncertainty_ns", "first"))
    tru = truth.sort_values("t_ns", kind="stable").groupby(KEY, observed=True)[["t_ns"]].first() \
        .rename(columns={"t_ns": "true_ns"})
    joined = rec.join(tru, how="inner").reset_index()
    joined["error_ns"] = joined["t_ns"] - joined["true_ns"]
    joined["covered"] = joined["error_ns"].abs() <= joined["uncertainty_ns"]
    return joined


@pytest.mark.parametrize("seed", range(6))
def test_match_watched_and_unrecorded_equal_pandas(seed):
    rng = np.random.default_rng(seed)
    strings = seed % 2 == 0  # else the truth's strings are Python objects (pandas' groupby makes strings of them)
    events, truth = frame(rng, 400), frame(rng, 300, dtype="string" if strings else "object")
    pd.testing.assert_frame_equal(match(events, truth), reference_match(events, truth))
    until = {c: int(rng.integers(0, 40)) * 1000 for c in range(3, 9) if c != 5}
    first = truth.groupby(KEY, observed=True, as_index=False)["t_ns"].min()
    limit = first["cycle"].map(until)
    expected = first[limit.notna() & (first["t_ns"] <= limit)].reset_index(drop=True)
    watched = watched_truth(truth, until)
    pd.testing.assert_frame_equal(watched, expected, check_dtype=strings)
    def plain(f):
        return pd.DataFrame({k: f[k].astype("int64" if k == "cycle" else str).to_numpy() for k in KEY})
    joined = plain(watched).merge(plain(events).drop_duplicates(), on=KEY, how="left", indicator=True)
    lost = watched.loc[(joined["_merge"] == "left_only").to_numpy()].reset_index(drop=True)
    assert len(lost) and len(lost) < len(watched)
    pd.testing.assert_frame_equal(unrecorded(events, watched), lost, check_dtype=strings)


@pytest.mark.parametrize("seed", range(4))
def test_port_stage_times_equal_pandas(seed):
    events = frame(np.random.default_rng(seed), 500, stages=NIC_STAGES[:4] + ("ocs_command_sent",))
    nic = events[events["stage"].isin(NIC_STAGES)]
    wide = nic.groupby(["cycle", "host", "port", "stage"], observed=True)["t_ns"].min().unstack("stage")
    wide = wide.reindex(columns=list(NIC_STAGES)).astype("float64")
    wide.columns.name = None
    pd.testing.assert_frame_equal(port_stage_times(events), wide)


def test_ocs_command_check_equals_pandas():
    rng = np.random.default_rng(3)
    events = frame(rng, 300, stages=("ocs_command_sent", "ocs_command_completed", "phy_up"))
    truth = frame(rng, 200, stages=("ocs_command_arrived", "mirror_settled"))
    truth["port"] = rng.choice(np.array(["kernel", "handled"], dtype=object), len(truth))
    truth = truth.astype({"port": "string"})

    def first(stage, how):
        rows = events[events["stage"] == stage]
        return rows.groupby("cycle").agg(**{f"{stage}_ns": ("t_ns", how), f"{stage}_bound_ns": ("uncertainty_ns",
                                                                                                 "first")})
    arrivals = truth[truth["stage"] == "ocs_command_arrived"].sort_values("t_ns", kind="stable")
    arrived = arrivals.groupby("cycle").agg(arrived_ns=("t_ns", "first"), arrived_by=("port", "first"))
    settled = truth[truth["stage"] == "mirror_settled"].groupby("cycle")["t_ns"].max().rename("settled_ns")
    out = first("ocs_command_sent", "min").join(arrived, how="inner").join(first("ocs_command_completed", "max")) \
        .join(settled).rename(columns={"ocs_command_sent_ns": "sent_ns", "ocs_command_sent_bound_ns": "sent_bound_ns",
                                       "ocs_command_completed_ns": "completed_ns",
                                       "ocs_command_completed_bound_ns": "completed_bound_ns"})
    check = ocs_command_check(events, truth)
    pd.testing.assert_frame_equal(check[list(out.reset_index().columns)], out.reset_index())


def test_keys_order_as_tuples_do_and_group_firsts_by_time():
    a = pd.DataFrame({"c": [2, 1, 2, 1], "s": pd.array(["b", "b", "a", None], dtype="string")})
    b = pd.DataFrame({"c": [1, 3], "s": ["a", "b"]})
    keys = Keys([a, b], ["c", "s"])
    assert keys.valid[0].tolist() == [True, True, True, False]
    tuples = [(2, "b"), (1, "b"), (2, "a")] + [(1, "a"), (3, "b")]
    codes = np.r_[keys.codes[0][:3], keys.codes[1]]
    assert [tuples[i] for i in np.argsort(codes)] == sorted(tuples)
    order, starts = first_of_groups(np.array([5, 3, 5, 3, 5]), np.ones(5, bool), by=np.array([9, 4, 1, 4, 1]))
    assert order[starts].tolist() == [1, 2]  # key 3: rows 1 and 3 tie at 4, the earlier row; key 5: row 2 (t 1)
    empty = Keys([a.iloc[:0], b.iloc[:0]], ["c", "s"])
    assert len(empty.codes[0]) == 0 and len(first_of_groups(empty.codes[0], empty.valid[0])[1]) == 0
