"""`harness sweep`: the `sweep:` block is validated with file:line errors; a small grid on a dask
LocalCluster gives the serial results (same points, same parameters, same emulator draws, same outcomes);
points are named by their values; a grid grows (only the new points run); a rerun skips finished points; a
point that ran is refused a new definition; points on a physical bench take turns under the
bench lease, also on a cluster given by its address."""
from __future__ import annotations

import json
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
import yaml

from devices.emulated.bench import EmulatedBench
from devices.emulated.profile import profile_from_dict
from harness import sweep
from harness.cli import main
from harness.config import load_inventory, load_playbook, override
from harness.errors import InputError
from harness.junit import junit_xml
from harness.lock import BenchLease, ocs_lease_keys

PROFILE = {"name": "two-hosts", "description": "small, instant", "source": "none (a test fixture).",
           "ocs": {"switch": {"dist": "fixed", "ms": 0.0}, "dark": {"dist": "fixed", "ms": 0.0}},
           "nic": {k: {"dist": "fixed", "ms": 0.0} for k in ("los_clear", "cdr_lock", "phy_up", "port_active",
                                                            "link_down")},
           "hosts": {"clock_offset_ms": [-5, 5], "drift_ppm": [-10, 10]},
           "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]}}
PLAYBOOK = """\
name: sw
bench: emulated:{profile}
seed: 1
cycles: 1
steps:
  - {{type: turnaround, name: measure, clock_warmup_s: 0.1, probes: false}}
sweep:
  grid:
    profile.ocs.switch.ms: [1.0, 3.0]
  seeds: [5]
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PROFILE))
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(text).format(profile=tmp_path / "p.yaml"))
    return path


@pytest.mark.parametrize("block, line, message", [
    ("  grid:\n    measure.nope: [1]\n", 9, "step 'measure' (turnaround) has no parameter 'nope'"),
    ("  grid:\n    other.cycle_timeout_s: [1]\n", 9, "expected STEP.PARAM (steps: measure)"),
    ("  grid:\n    measure.cycle_timeout_s:\n      - 5\n      - fast\n", 11, "for step 'measure'.cycle_timeout_s: expected a number"),
    ("  grid:\n    cycles: [2, 0]\n", 9, "sweep.grid.cycles[1]: expected a positive integer"),
    ("  grid:\n    measure.probes: []\n", 9, "expected a non-empty list"),
    ("  grid:\n    cycles: [1]\n  seeds: [1, 1]\n", 10, "a seed is listed twice"),
    ("  grid:\n    cycles: [1]\n  workers: 3\n", 10, "unknown key 'workers'"),
])
def test_bad_sweep_block_names_file_and_line(tmp_path, block, line, message):
    head = PLAYBOOK.split("sweep:")[0]
    path = write(tmp_path, head + "sweep:\n" + block)
    with pytest.raises(InputError) as err:
        load_playbook(path)
    assert (err.value.file, err.value.line) == (str(path), line) and message in err.value.message


def test_grid_expands_over_steps_assumptions_profile_and_seeds(tmp_path):
    path = write(tmp_path, PLAYBOOK.replace("profile.ocs.switch.ms: [1.0, 3.0]",
                                            "profile.ocs.switch.ms: [1.0, 3.0]\n    measure.pattern: "
                                            "[ring-shift, random-matching]").replace("[5]", "[5, 6]"))
    pb = load_playbook(path)
    points = sweep.expand(pb.sweep, pb.seed)
    assert len(points) == 8 and [p.seed for p in points[:2]] == [5, 6]
    assert points[7].params == {"profile.ocs.switch.ms": 3.0, "measure.pattern": "random-matching"}
    assert len({p.key for p in points}) == 8
    data = sweep.point_playbook(pb, points[7])
    assert "sweep" not in data and data["seed"] == 6 and data["steps"][0]["pattern"] == "random-matching"
    assert sweep.point_profile(pb.bench, points[7])["ocs"]["switch"] == {"dist": "fixed", "ms": 3.0}
    # An analysis assumption is a nested step parameter; the override keeps the rest of the mapping.
    assert override({"baseline": {"gpu": "a", "skew": 0.5}}, "baseline.skew", 0.8) == \
        {"baseline": {"gpu": "a", "skew": 0.8}}


DETERMINED = ["profile.ocs.switch.ms", "seed", "point", "exit_code", "outcome", "light_detected_n",
              "port_active_n", "truth_draws", "truth_draws_sha256", "truth_switch_mean_ms", "accuracy_coverage",
              "true_events", "lost_in_ok_cycles"]


def test_sweep_on_a_local_cluster_equals_serial_grows_resumes_and_refuses_a_changed_point(tmp_path, capsys):
    path = write(tmp_path, PLAYBOOK)
    # the serial sweep grows: one value first, then the second runs alone and the first is reused
    first = tmp_path / "one.yaml"
    first.write_text(path.read_text().replace("[1.0, 3.0]", "[1.0]"))
    assert main(["sweep", str(first), "--out", str(tmp_path / "serial"), "--serial", "-q"]) == 0
    done = tmp_path / "serial" / "points" / "profile.ocs.switch.ms=1.0,seed=5"
    stamp = (done / "point.json").read_text()
    capsys.readouterr()
    assert main(["sweep", str(path), "--out", str(tmp_path / "serial"), "--serial", "-q"]) == 0
    assert "(1 run now, 1 already finished)" in capsys.readouterr().out
    assert (done / "point.json").read_text() == stamp
    assert main(["sweep", str(path), "--out", str(tmp_path / "dask"), "--workers", "2", "-q"]) == 0
    serial = pd.read_parquet(tmp_path / "serial" / sweep.RESULTS_NAME)
    parallel = pd.read_parquet(tmp_path / "dask" / sweep.RESULTS_NAME)
    assert list(serial["profile.ocs.switch.ms"]) == [1.0, 3.0] and list(serial["outcome"]) == ["completed"] * 2
    # Measured times are measurements (µs of scheduling jitter between any two runs); everything the seed and
    # the parameters decide is identical, and every recorded time contains the true one in both.
    pd.testing.assert_frame_equal(serial[DETERMINED], parallel[DETERMINED])
    assert list(serial["truth_switch_mean_ms"]) == [1.0, 3.0] and (serial["accuracy_coverage"] == 1.0).all()
    assert (serial["true_events"] > 0).all() and (serial["lost_in_ok_cycles"] == 0).all()
    run = tmp_path / "dask" / "points" / parallel["run_dir"][1]
    assert yaml.safe_load(next((run / "inputs").glob("*profile*.yaml")).read_text())["ocs"]["switch"]["ms"] == 3.0
    capsys.readouterr()
    junit = tmp_path / "sweep-junit.xml"
    assert main(["sweep", str(path), "--out", str(tmp_path / "dask"), "-q", "--junit", str(junit)]) == 0  # resume
    assert "(0 run now, 2 already finished)" in capsys.readouterr().out
    # the sweep's JUnit file: each point's own run file (harness.junit.junit_xml), its suites named POINT/SUITE
    suites = ET.parse(junit).getroot()
    for point in parallel["run_dir"]:
        own = ET.fromstring(junit_xml(tmp_path / "dask" / "points" / point))
        mine = [el for el in suites if el.get("name").startswith(f"{point}/")]
        assert [el.get("name") for el in mine] == [f"{point}/{el.get('name')}" for el in own]
        assert [[(c.get("name"), [o.tag for o in c]) for c in el] for el in mine] == \
            [[(c.get("name"), [o.tag for o in c]) for c in el] for el in own]
    assert suites.get("tests") == str(sum(len(el) for el in suites)) and suites.get("failures") == "0"
    # a point that ran is never redefined: another warm-up changes every point's playbook
    path.write_text(path.read_text().replace("[1.0, 3.0]", "[1.0, 3.0, 4.0]").replace("clock_warmup_s: 0.1",
                                                                                        "clock_warmup_s: 0.2"))
    assert main(["sweep", str(path), "--out", str(tmp_path / "dask"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "2 point(s) already started would now be defined differently: profile.ocs.switch.ms=1.0,seed=5 " \
        "(playbook); profile.ocs.switch.ms=3.0,seed=5 (playbook)" in err, err
    assert not (tmp_path / "dask" / "inputs" / "profile.ocs.switch.ms=4.0,seed=5.playbook.yaml").exists()


# ------------------------------------------------------------------ points on a physical bench
PHYSICAL = PLAYBOOK.replace("profile.ocs.switch.ms: [1.0, 3.0]", "measure.pattern: [ring-shift, random-matching]")


@pytest.fixture(scope="module")
def inventory_bench(tmp_path_factory):
    """An emulated bench started here and handed to the sweep as an inventory: the sweep treats it as the
    lab's physical bench (points chained, each under the bench lease), as it would a real one."""
    with EmulatedBench(profile_from_dict(PROFILE), seed=2, workdir=tmp_path_factory.mktemp("bench")) as bench:
        yield bench


def _hold_the_bench(bench) -> BenchLease:
    (ocs,) = load_inventory(bench.inventory_path).ocs.items()
    return BenchLease(ocs_lease_keys(ocs[1]), run_id="someone-else").acquire()


def _wait_for(path: Path, alive, timeout_s: float = 180.0) -> dict:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert alive() and time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_physical_points_take_turns_under_the_lease_on_a_given_scheduler(tmp_path, inventory_bench, capsys,
                                                                        monkeypatch):
    """Two points on a 2-worker cluster reached by its tcp:// address: the first waits for a lease someone
    else holds and starts only once it is released; the second is chained after the first (never refused:
    it never raced for the bench); their runs do not overlap, and the switch ends as it was found."""
    from distributed import LocalCluster  # here, not at the top: every test worker collects this module

    # The waiting point looks again every 0.2 s, not every 2 s (the cluster's workers are this process's threads):
    # the lease is released as soon as its first refusal is seen, and that look found it free 2 s later.
    monkeypatch.setattr(sweep, "LEASE_POLL_S", 0.2)
    path = write(tmp_path, PHYSICAL)
    points = sweep.expand(load_playbook(path).sweep, 1)
    original = inventory_bench.physics.ocs_patches()
    holder = _hold_the_bench(inventory_bench)
    out = tmp_path / "sweep"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        exit_code = []
        sweeping = threading.Thread(target=lambda: exit_code.append(main(
            ["sweep", str(path), "--bench", str(inventory_bench.inventory_path), "--out", str(out),
             "--scheduler", cluster.scheduler_address, "-q"])))
        sweeping.start()
        try:
            waiting = _wait_for(sweep.lease_wait_path(out / "points" / points[0].name), sweeping.is_alive)
            assert waiting["refusals"] >= 1 and "someone-else" in waiting["holder"]
            assert not (out / "points" / points[1].name).exists()  # chained: not started while the first waits
        finally:
            released_ns = time.time_ns()
            holder.release()
            sweeping.join(timeout=300)
        assert exit_code == [0], capsys.readouterr()
        computed = cluster.scheduler.task_prefixes["point"].state_counts["memory"]  # cumulative transitions
        assert computed == 2  # both points ran on this cluster's workers
    first, second = (json.loads((out / "points" / p.name / "point.json").read_text()) for p in points)
    assert first["lease_refusals"] >= 1 and first["started_ns"] >= released_ns
    assert second["lease_refusals"] == 0 and second["started_ns"] >= first["ended_ns"]
    # the runs' own events on the harness clock (CLOCK_MONOTONIC, one per machine) agree: one after the other
    a, b = (pd.read_parquet(out / "points" / p.name / "events.parquet")["t_ns"] for p in points)
    assert a.max() < b.min()
    assert not sweep.lease_wait_path(out / "points" / points[0].name).exists()
    assert inventory_bench.physics.ocs_patches() == original
    results = pd.read_parquet(out / sweep.RESULTS_NAME)
    assert list(results["measure.pattern"]) == ["ring-shift", "random-matching"]
    assert list(results["outcome"]) == ["completed"] * 2 and "truth_draws" not in results  # no truth on an inventory


def test_a_physical_point_that_may_not_wait_fails_naming_the_lease_holder(tmp_path, inventory_bench, capsys):
    path = write(tmp_path, PHYSICAL.replace("[ring-shift, random-matching]", "[ring-shift]"))
    holder = _hold_the_bench(inventory_bench)
    try:
        code = main(["sweep", str(path), "--bench", str(inventory_bench.inventory_path), "--out",
                     str(tmp_path / "sweep"), "--serial", "--lease-wait", "0", "-q"])
    finally:
        holder.release()
    out = capsys.readouterr().out
    assert code == 2 and "exit 2: " in out and "bench is locked: " in out and "(run someone-else)" in out, out
    assert "(waited 0 s for the bench lease)" in out
    assert not list((tmp_path / "sweep" / "points").glob("*/point.json"))  # unfinished: a rerun runs it


def test_the_local_cluster_listens_on_loopback_only():
    """Issue 38, reproduction 10: the workers' HTTP servers listened on every interface (0.0.0.0, ::)."""
    import ipaddress

    import psutil

    from harness.sweep import _client

    with _client(None, 2):
        listening = [c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == "LISTEN"]
    assert listening and all(ipaddress.ip_address(ip).is_loopback for ip in listening), listening


def test_point_names_are_readable_safe_bounded_and_unique():
    points = sweep.expand({"grid": {"measure.pattern": ["ring-shift", "a/b", "a_b"], "verdict.baseline":
                                    [{"gpu": "h100-sxm"}]}, "seeds": [5]}, 1)
    names = [p.name for p in points]
    assert len(set(names)) == 3 and all(len(n) <= sweep.NAME_MAX and "/" not in n for n in names)
    # a value that needed a replaced character ends in the point's hash: "a/b" and "a_b" stay apart
    assert names[2].startswith("measure.pattern=a_b,verdict.baseline=gpu_h100-sxm,seed=5~")
    assert names[1] != names[2] and names[1].endswith(points[1].key)
    plain = sweep.expand({"grid": {"measure.pattern": ["ring-shift"], "cycles": [3]}, "seeds": [7]}, 1)[0]
    assert plain.name == "measure.pattern=ring-shift,cycles=3,seed=7"
    long = sweep.expand({"grid": {"measure.pattern": ["x" * 300]}, "seeds": []}, 2)[0]
    assert len(long.name) == sweep.NAME_MAX and long.name.endswith(long.key)
    # a name sweep.json gave a point first stays its name; a new point whose readable name is taken is hashed
    two = sweep.expand({"grid": {"cycles": [3, 4]}, "seeds": [7]}, 1)
    renamed = sweep.name_points(two, {two[0].identity: "old-name", "another point": "cycles=4,seed=7"})
    assert [p.name for p in renamed] == ["old-name", f"cycles=4,seed=7~{two[1].key}"]


def test_a_grid_grows_by_seeds_and_values_and_keeps_its_points(tmp_path):
    """Planned only (no point runs): more seeds and values add points, the earlier ones keep their names and
    inputs; a point not yet started may be redefined; a grid over other parameters is refused."""
    path = write(tmp_path, PLAYBOOK)
    out = str(tmp_path / "sw")
    before = sweep.plan(str(path), bench=None, out=out)
    inputs = {p.name: (before.sweep_dir / "inputs" / f"{p.name}.playbook.yaml").read_text() for p in before.points}
    path.write_text(path.read_text().replace("[1.0, 3.0]", "[1.0, 3.0, 4.0]").replace("[5]", "[5, 6]"))
    grown = sweep.plan(str(path), bench=None, out=out)
    assert [p.name for p in grown.points] == [f"profile.ocs.switch.ms={v},seed={s}" for v in (1.0, 3.0, 4.0)
                                              for s in (5, 6)]
    assert all((grown.sweep_dir / "inputs" / f"{n}.playbook.yaml").read_text() == t for n, t in inputs.items())
    assert len(json.loads((grown.sweep_dir / sweep.SPEC_NAME).read_text())["points"]) == 6
    # nothing started yet: another warm-up redefines the points instead of refusing them
    path.write_text(path.read_text().replace("clock_warmup_s: 0.1", "clock_warmup_s: 0.2"))
    again = sweep.plan(str(path), bench=None, out=out)
    assert "clock_warmup_s: 0.2" in Path(again.jobs[0].playbook).read_text()
    path.write_text(path.read_text().replace("profile.ocs.switch.ms:", "cycles: [1]\n    profile.ocs.switch.ms:"))
    with pytest.raises(InputError, match="a grid grows by values and seeds, not by parameters"):
        sweep.plan(str(path), bench=None, out=out)
