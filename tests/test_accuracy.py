import pandas as pd

from analysis.accuracy import accuracy_table, assign_cycles, match


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
