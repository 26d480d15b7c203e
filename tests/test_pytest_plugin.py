"""The pytest plugin (harness/pytest_plugin.py), exercised the way a lab uses it: inner pytest sessions."""
from __future__ import annotations

import textwrap
from pathlib import Path

# Imported before any inner session: pytester unloads the modules an inner session imported first, and the
# next session's re-import would register pandas' pyarrow extension types twice (ArrowKeyError).
import pandas.core.arrays.arrow.extension_types  # noqa: F401
import pytest

pytest_plugins = ["pytester"]

TURNAROUND = textwrap.dedent("""\
    name: lab-turnaround
    bench: emulated:instant
    seed: 4
    cycles: 2
    steps:
      - type: turnaround
        name: measure
        pattern: ring-shift
        cycle_timeout_s: 20
    """)


def test_ocs_and_hosts_fixtures_drive_the_emulated_bench_and_the_switch_is_put_back(pytester):
    pytester.makepyfile(test_lab=textwrap.dedent("""\
        ORIGINAL = {}

        def test_a_changes_a_cross_connect(bench, ocs, hosts):
            assert bench.emulated and bench.spec == "emulated:instant"
            assert set(hosts) == set(bench.resources.hosts)
            for name, ssh in hosts.items():
                assert ssh.run("echo hello").stdout.strip() == "hello"
            ORIGINAL.update(ocs.patches())
            port = bench.resources.nic_ports[0]
            peer = bench.resources.nic_ports[1]
            ocs.apply({port.ocs_tx: peer.ocs_rx}, exclusive=True)
            assert ocs.patches()[port.ocs_tx] == peer.ocs_rx
            assert ocs.patches() != ORIGINAL

        def test_b_finds_what_test_a_found(ocs):
            assert ocs.patches() == ORIGINAL
        """))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_on_a_bench_with_two_switches_an_ocs_test_runs_once_per_switch_and_each_is_put_back(pytester):
    pytester.makepyfile(test_lab=textwrap.dedent("""\
        SEEN = {}

        def test_a_changes_a_cross_connect(bench, ocs, ocs_name):
            ports = [p for p in bench.resources.nic_ports if p.ocs == ocs_name]
            assert len(ports) == 4  # rails: each host's NIC k on switch k
            SEEN[ocs_name] = ocs.patches()
            ocs.apply({ports[0].ocs_tx: ports[1].ocs_rx}, exclusive=True)
            assert ocs.patches() == {ports[0].ocs_tx: ports[1].ocs_rx}

        def test_b_finds_what_test_a_found(ocs, ocs_name, bench):
            assert ocs.patches() == SEEN[ocs_name] == {}
            assert bench.emulator.physics.ocs_patches() == {}
        """))
    result = pytester.runpytest("-p", "no:cacheprovider", "-v", "--bench",
                                "emulated:instant?ocs=polatis-tl1,polatis-scpi")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_a_changes_a_cross_connect?ocs1? PASSED*",
                                 "*test_a_changes_a_cross_connect?ocs2? PASSED*"])
    only = pytester.runpytest("-p", "no:cacheprovider", "--bench", "emulated:instant?ocs=polatis-tl1,polatis-scpi",
                              "--bench-ocs", "ocs2")
    only.assert_outcomes(passed=2)


def test_hardware_marker_skips_on_an_emulated_bench_with_the_reason(pytester):
    pytester.makepyfile(test_hw=textwrap.dedent("""\
        import pytest

        @pytest.mark.hardware
        def test_needs_a_real_switch(ocs):
            raise AssertionError("must not run on an emulated bench")

        def test_runs_anywhere():
            pass
        """))
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs", "--bench", "emulated:burst-mode")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs a real bench*emulated:burst-mode, emulated*"])


def test_run_playbook_returns_the_typed_run_and_a_failing_test_names_its_run_directory(pytester):
    """One run: the typed result is checked inside the inner test, which then fails on purpose — only after
    every check held — so that its report must name the run directory."""
    pytester.makefile(".yaml", lab_turnaround=TURNAROUND)
    pytester.makepyfile(test_runs=textwrap.dedent("""\
        def test_turnaround_is_recorded(run_playbook):
            run = run_playbook("lab_turnaround.yaml")
            assert run.ok, (run.status, run.checks)
            events = run.events()
            assert set(events["cycle"]) == {1, 2}
            assert (events["stage"] == "first_packet").any()
            truth = run.ground_truth()
            assert truth is not None and len(truth) > 0
            assert run.manifest()["seed"] == 4 and run.summary()
            raise AssertionError("every check held")
        """))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: every check held*", "*ocs-hil run directories*"])
    run_dirs = [line.strip() for line in result.stdout.lines if line.rstrip().endswith("run-1")]
    assert run_dirs and (Path(run_dirs[-1]) / "events.jsonl").exists()


def test_a_bad_bench_option_is_a_usage_error_not_a_traceback(pytester):
    pytester.makepyfile(test_x="def test_x(bench):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--bench", "emulated:no-such-profile")
    assert result.ret != 0
    assert "Traceback" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*no-such-profile*"])


def test_the_shipped_lab_example_runs_as_a_user_would_run_it(pytester):
    """examples/test_lab_turnaround.py, copied with its playbook, passes on the emulated bench and skips its
    hardware-only test with the reason."""
    examples = Path(__file__).resolve().parents[1] / "examples"
    for name in ("test_lab_turnaround.py", "lab-turnaround.yaml"):
        (pytester.path / name).write_text((examples / name).read_text())
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*needs a real bench*"])


def test_on_an_inventory_bench_a_run_borrows_the_sessions_lease_and_bad_input_is_exit_2(pytester, tmp_path):
    """--bench INVENTORY, as a lab runs it (an emulated bench described by its inventory stands in for the
    real one): the `ocs` fixture leases the switch for the session, a run_playbook on the same bench takes
    that lease for its duration (the runner leases the bench itself) and gives it back; bad input is a
    PlaybookRun with exit 2 and the file:line message, not an exception."""
    from devices.emulated.bench import EmulatedBench
    from devices.emulated.profile import load_profile

    pytester.makefile(".yaml", lab_turnaround=TURNAROUND, broken="name: x\nsteps:\n  - type: turnaround\n    pattern: 3\n")
    pytester.makepyfile(test_lab=textwrap.dedent("""\
        from harness.lock import lock_dir, read_lease

        def held_by_this_session():
            return [l for l in map(read_lease, lock_dir().glob("ocs-*.json")) if l and l.get("run_id") == "pytest"]

        def test_a_the_switch_is_leased(bench, ocs):
            assert not bench.emulated or bench.spec.endswith("inventory.yaml")
            assert ocs.patches() is not None and len(held_by_this_session()) == 1

        def test_b_a_run_on_the_same_bench_borrows_the_lease(run_playbook, ocs):
            before = ocs.patches()
            run = run_playbook("lab_turnaround.yaml")
            assert run.ok, (run.status, run.checks, run.error)
            assert run.manifest()["extra"]["restored"] == {"ocs1": True} and run.ground_truth() is None
            assert len(held_by_this_session()) == 1 and ocs.patches() == before

        def test_b2_the_same_switch_under_another_inventory_file_too(run_playbook, bench, tmp_path):
            copy = tmp_path / "same-switch.yaml"
            copy.write_bytes(bench.inventory.read_bytes())
            run = run_playbook("lab_turnaround.yaml", bench=str(copy), cycles=1)
            assert run.ok, (run.status, run.checks, run.error)

        def test_c_bad_input_is_exit_2_with_the_message(run_playbook):
            run = run_playbook("broken.yaml")
            assert (run.exit_code, run.status, run.run_dir) == (2, "input_error", None)
            assert "broken.yaml:4" in run.error
        """))
    with EmulatedBench(load_profile("instant"), seed=5, workdir=tmp_path / "bench") as bench:
        result = pytester.runpytest("-p", "no:cacheprovider", "--bench", str(bench.inventory_path))
    result.assert_outcomes(passed=4)
