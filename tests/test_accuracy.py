import numpy as np
import pandas as pd
import pytest

from analysis.accuracy import KEY, accuracy_table, assign_cycles, clock_sample_errors, match, unrecorded, watched_truth


def test_cycles_are_assigned_by_start_time():
    truth = pd.DataFrame({"stage": ["phy_up"] * 4, "host": "h", "port": "p", "t_ns": [5, 10, 15, 30]})
    out = assign_cycles(truth, [(1, 10), (2, 20)])
    assert out["cycle"].tolist() == [1, 1, 2]
    assert out["t_ns"].tolist() == [10, 15, 30]


def test_error_and_coverage_per_stage():
    events = pd.DataFrame({"cycle": [1, 1, 2], "stage": ["phy_up", "port_active", "phy_up"], "host": "h",
                           "port": "p", "t_ns": [100, 200, 300], "uncertainty_ns": [10, 5, 50]})
    truth = pd.DataFrame({"cycle": [1, 1, 2], "stage": ["phy_up", "port_active", "phy_up"], "host": "h",
                          "port": "p", "t_ns": [95, 210, 300]})
    m = match(events, truth)
    assert sorted(m["error_ns"].tolist()) == [-10, 0, 5]
    assert m.set_index(["cycle", "stage"])["covered"].to_dict() == {(1, "phy_up"): True, (1, "port_active"): False,
                                                                    (2, "phy_up"): True}
    table = accuracy_table(m).set_index("stage")
    assert table.loc["all", "n"] == 3 and abs(table.loc["all", "coverage"] - 2 / 3) < 1e-12


def test_true_events_the_harness_did_not_record_while_their_cycle_was_watched():
    """By hand: a port's repeated stage counts once (its first), a true event after its cycle stopped watching
    or in a cycle nobody watched is not the harness's to record, and a recorded event of another port, stage or
    cycle does not stand in for the missing one."""
    truth = pd.DataFrame({"cycle": [1, 1, 1, 1, 2, 2, 3], "stage": ["phy_up", "phy_up", "port_active", "phy_up",
                                                                    "phy_up", "port_active", "phy_up"],
                          "host": ["h", "h", "h", "g", "h", "h", "h"], "port": "p",
                          "t_ns": [100, 150, 200, 120, 1100, 1900, 2100]})
    watched = watched_truth(truth, {1: 1000, 2: 1500})  # cycle 2 stopped watching before its port_active
    assert sorted(zip(watched["cycle"], watched["stage"], watched["host"], watched["t_ns"])) == [
        (1, "phy_up", "g", 120), (1, "phy_up", "h", 100), (1, "port_active", "h", 200), (2, "phy_up", "h", 1100)]
    events = pd.DataFrame({"cycle": [1, 1, 2, 1], "stage": ["phy_up", "fault", "port_active", "phy_up"],
                           "host": ["h", "h", "h", "x"], "port": pd.Categorical(["p", "", "p", "p"]),
                           "t_ns": [101, 0, 1901, 5]})
    lost = unrecorded(events, watched)
    assert sorted(zip(lost["cycle"], lost["stage"], lost["host"])) == [
        (1, "phy_up", "g"), (1, "port_active", "h"), (2, "phy_up", "h")]
    assert unrecorded(events, watched.iloc[0:0]).empty
    everything = pd.concat([events, watched.assign(uncertainty_ns=0)], ignore_index=True)
    assert unrecorded(everything, watched).empty


def test_clock_samples_against_the_emulated_clocks_truth():
    """Errors of kept clock samples against the emulator's own host clocks (offset and drift, over an hour so
    the drift term counts), exactly; a host without truth is left out."""
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import profile_from_dict

    profile = profile_from_dict({
        "name": "clocks", "ocs": {"switch": {"dist": "fixed", "ms": 1}, "dark": {"dist": "fixed", "ms": 0.1}},
        "nic": {k: {"dist": "fixed", "ms": 0.1} for k in ("los_clear", "cdr_lock", "phy_up", "port_active",
                                                         "link_down")},
        "hosts": {"clock_offset_ms": [-30, 30], "drift_ppm": [-20, 20]},
        "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]}})
    with OpticalBench(profile, seed=4) as bench:
        rows = []
        for host in bench.hosts:
            for t, err, u in [(10**9, 0, 5), (3 * 10**11, 7, 5), (3_600 * 10**9 + 123, -40, 50)]:
                rows.append({"host": host, "t_ns": t, "offset_ns": bench.host_time(host, t) - t + err,
                             "delay_ns": 2 * u, "uncertainty_ns": u})
        rows.append({"host": "not-emulated", "t_ns": 1, "offset_ns": 0, "delay_ns": 0, "uncertainty_ns": 0})
        clocks = {h: bench.host_clock_params(h) for h in bench.hosts}
        assert len({round(c["drift_ppm"], 6) for c in clocks.values()} - {0.0}) == 2  # both drift, differently
        out = clock_sample_errors(pd.DataFrame(rows), clocks)
    assert out["host"].tolist() == [h for h in bench.hosts for _ in range(3)]
    assert out["error_ns"].tolist() == [0, 7, -40] * 2
    assert out["covered"].tolist() == [True, False, True] * 2


def test_the_recorded_ocs_command_against_the_switchs_record():
    """Per cycle, by hand: transit = first arrival − recorded send; a send whose lower bound is after the
    arrival is not causal; completion − last settling, and a completion whose upper bound is before it; a cycle
    without an arrival is left out."""
    from analysis.accuracy import ocs_command_check, ocs_command_table

    events = pd.DataFrame({
        "cycle": [1, 1, 1, 2, 2, 3, 3],
        "stage": ["ocs_command_sent", "ocs_command_completed", "phy_up", "ocs_command_sent",
                  "ocs_command_completed", "ocs_command_sent", "ocs_command_completed"],
        "t_ns": [1_000, 30_000, 31_000, 100_000, 120_000, 200_000, 230_000],
        "uncertainty_ns": [10, 50, 5, 10, 100, 10, 50]})
    truth = pd.DataFrame({
        "cycle": [1, 1, 1, 1, 2, 2],
        "stage": ["ocs_command_arrived", "ocs_command_arrived", "mirror_settled", "mirror_settled",
                  "ocs_command_arrived", "mirror_settled"],
        # cycle 1: arrivals 1 040 and 1 500 (the first counts), settled 28 000 and 29 000 (the last counts);
        # cycle 2: arrival 20 before the recorded send's lower bound; the completion's upper bound is 500
        # before its mirror settled
        "t_ns": [1_500, 1_040, 28_000, 29_000, 99_970, 120_600],
        "port": ["kernel", "handled", "17", "18", "kernel", "17"]})  # how each arrival was dated (or the egress)
    check = ocs_command_check(events, truth).set_index("cycle")
    assert list(check.index) == [1, 2]  # cycle 3: no arrival
    assert check["transit_ns"].to_dict() == {1: 40, 2: -30}
    assert check["arrived_by"].to_dict() == {1: "handled", 2: "kernel"}  # the first arrival's dating
    assert check["causal"].to_dict() == {1: True, 2: False}
    assert check["settled_to_completed_ns"].to_dict() == {1: 1_000, 2: -600}
    assert check["completed_before_settled"].to_dict() == {1: False, 2: True}
    table = ocs_command_table(check.reset_index())
    assert table["n"] == 2 and table["not_causal"] == 1 and table["completed_before_settled"] == 1
    assert table["arrived_by"] == {"handled": 1, "kernel": 1}
    assert table["transit_max_ms"] == 40 / 1e6 and abs(table["transit_p50_ms"] - 5 / 1e6) < 1e-15
    assert table["settled_to_completed_n"] == 2 and abs(table["settled_to_completed_p50_ms"] - 200 / 1e6) < 1e-15


def test_a_truth_known_to_within_a_window_is_met_by_a_bound_that_reaches_the_window():
    """sshd hosts' kernel changes are known only to within the window of the call that made them: a recorded
    bound covers such a truth when the two intervals meet, and not otherwise."""
    key = {"cycle": [1, 1, 1], "stage": ["phy_up"] * 3, "host": ["h"] * 3, "port": ["p0", "p1", "p2"]}
    events = pd.DataFrame({**key, "t_ns": [1_000, 1_000, 1_000], "uncertainty_ns": [100, 100, 100]})
    truth = pd.DataFrame({**key, "t_ns": [1_500, 1_500, 1_150], "truth_halfwidth_ns": [400, 399, 0]})
    m = match(events, truth).set_index("port")
    assert m["covered"].tolist() == [True, False, False]
    assert m["error_ns"].tolist() == [-500, -500, -150]
    exact = match(events, truth.drop(columns="truth_halfwidth_ns")).set_index("port")
    assert not exact["covered"].any()


def test_unrecorded_is_the_set_difference_whatever_the_columns_dtypes():
    """The join against a brute-force oracle (a Python set of keys, the implementation it replaced): random
    keys with repeats, missing values and string, category and object columns on either side."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        def frame(n, dtype):
            cols = {"cycle": rng.integers(1, 6, n), "t_ns": rng.integers(0, 10**6, n)}
            for k, choices in (("stage", ["phy_up", "port_active", "fault"]), ("host", ["h", "g", None]),
                               ("port", ["p", "q", ""])):
                cols[k] = pd.Series(rng.choice(np.array(choices, dtype=object), n)).astype(dtype)
            return pd.DataFrame(cols)
        dtypes = ["string", "category", object]
        events = frame(int(rng.integers(0, 40)), dtypes[trial % 3])
        watched = frame(int(rng.integers(0, 40)), dtypes[(trial // 3) % 3])

        def key_set(f):
            return list(zip(*(f[k].astype(str if k != "cycle" else "int64") for k in KEY)))
        seen = set(key_set(events))
        expected = watched.loc[[key not in seen for key in key_set(watched)]].reset_index(drop=True)
        pd.testing.assert_frame_equal(unrecorded(events, watched), expected)


def test_the_accuracy_table_of_category_stages_is_that_of_their_names():
    """A run's end keeps each matched truth's stage as a category over every stage name (most unused): the
    table is the one the names give, with no row for a stage that has no pair."""
    rng = np.random.default_rng(3)
    names = rng.choice(["phy_up", "light_detected", "port_active"], 500)
    plain = pd.DataFrame({"stage": names, "error_ns": rng.integers(-10**6, 10**6, 500),
                          "covered": rng.random(500) < 0.9})
    coded = plain.assign(stage=pd.Categorical(names, categories=sorted(["cdr_locked", "first_packet", "light_detected",
                                                                         "phy_up", "port_active"])))
    pd.testing.assert_frame_equal(accuracy_table(coded), accuracy_table(plain))


def test_late_cycles_judge_each_action_against_its_own_stages_resolution():
    from analysis.accuracy import late_cycles

    ms = 1_000_000
    # a short stage (p99 2 ms: resolution 0.1 ms) and a long one (p99 1 s: resolution 50 ms)
    draws = pd.DataFrame({
        "stage": ["short"] * 4 + ["long"] * 4, "port": ["a", "b", "a", "b", "a", "b", "a", "b"],
        "delay_ns": [2 * ms] * 4 + [1000 * ms] * 4,
        "late_ns": [0.05 * ms, 0, 0.3 * ms, 0.2 * ms, 40 * ms, 0, 0, 60 * ms],
        "due_ns": [5 * ms, 105 * ms, 205 * ms, 206 * ms, 110 * ms, 50 * ms, 300 * ms, -1]})
    starts = [(-1, 0), (1, 100 * ms), (2, 200 * ms)]
    # cycle 1: a long action 40 ms late (under its 50 ms) and a short one on time; cycle 2: two short actions
    # late beyond 0.1 ms (the latest named); warm-up (cycle -1) is not a measured cycle; a draw that never ran
    # (due -1, its lateness 60 ms is a placeholder) belongs to no cycle
    assert late_cycles(draws, starts) == [{"cycle": 2, "late_ms": pytest.approx(0.3), "stage": "short", "port": "a",
                                           "threshold_ms": pytest.approx(0.1)}]
    # at a coarser floor nothing is late
    assert late_cycles(draws, starts, floor_ms=0.5) == []
    # judged on the long stage's actions alone (the short one times no stamp asked about): none late
    assert late_cycles(draws, starts, stages=("long",)) == []
    assert [r["cycle"] for r in late_cycles(draws, starts, stages=("short",))] == [2]
    assert late_cycles(draws.iloc[0:0], starts) == []
