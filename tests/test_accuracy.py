import pandas as pd

from analysis.accuracy import accuracy_table, assign_cycles, clock_sample_errors, match


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
