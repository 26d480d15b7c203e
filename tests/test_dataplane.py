"""The emulated tools' data plane (devices/emulated/dataplane.py): transfers integrated over the ports' state
timelines at due times — closed forms for constant states, hand-computed piecewise answers for links pulled
mid-flight, and independence from when (or how often) the integrating thread runs."""
from __future__ import annotations

import pytest

from devices.emulated.dataplane import FabricView, Peer, Transfer, carries
from devices.emulated.nic import NicSnapshot

MS = 1_000_000
BC, BE = 50e9, 12.5e9  # 400 Gb/s circuit, 100 Gb/s packet fabric (bytes/s)
DETECT = 2 * MS


def up(by: str) -> NicSnapshot:
    return NicSnapshot(rx_los=False, rx_lol=False, carrier=True, phys_state="LinkUp", ib_state="ACTIVE",
                       operstate="up", lit_by=by)


def dark(at: int) -> NicSnapshot:
    return NicSnapshot(light_lost_ns=at, ib_state="ACTIVE", carrier=True)  # light gone, link not yet down


class Script:
    """A scripted physics: per port, its state at 0 and (due ns, state) changes; `now` set by the test."""

    def __init__(self, initial: dict, changes: dict | None = None):
        self.initial, self.now = initial, 0
        self.log = sorted(((t, k, st) for k, ch in (changes or {}).items() for t, st in ch), key=lambda c: c[0])

    def states(self):
        out = dict(self.initial)
        for t, key, state in self.log:
            if t <= self.now:
                out[key] = state
        return self.now, out

    def changes(self, since_ns):
        return self.now, [c for c in self.log if since_ns < c[0] <= self.now]

    def view(self, keys=None) -> FabricView:
        return FabricView(self.states, self.changes, lambda key, lost: DETECT)


def run_to_end(script: Script, transfer: Transfer, step_ns: int | None = None, until: int = 10**12) -> int:
    """Advance like a tool thread: in steps of `step_ns` (None: once, long after the end)."""
    t = script.now
    while transfer.finish_ns is None:
        t = until if step_ns is None else t + step_ns
        script.now = t
        transfer.advance(t)
    return transfer.finish_ns


def test_constant_state_is_the_closed_form():
    s = Script({"a": up("b"), "b": up("a"), "c": up("d"), "d": up("c")})
    view = s.view(["a", "b", "c", "d"])
    peers = [Peer("b", 4e8, 1e8, BC), Peer("c", 2e8, 3e8, BC), Peer("d", 1e8, 1e8, BC)]
    tr = Transfer(view, "a", peers, BE, 10_000, 0)
    end = run_to_end(s, tr)
    # the circuit to b (heavier direction 4e8) against the pool of c and d: max(3e8, 4e8) over the fabric
    assert end == pytest.approx(10_000 + max(4e8 / BC, max(3e8, 4e8) / BE) * 1e9, abs=3)
    assert tr.delivered(end) == pytest.approx((7e8, 5e8))
    assert tr.delivered(10_000) == (0.0, 0.0)  # nothing moves during the start-up latency
    # halfway through the circuit's part: b's 4e8 at BC, the pool at BE split by what is left
    t = 10_000 + int(4e8 / BC / 2 * 1e9)
    sent, _ = tr.delivered(t)
    assert sent == pytest.approx(2e8 + BE * (t - 10_000) / 1e9, rel=1e-6)


def test_a_link_pulled_mid_flight_stalls_until_detected_then_finishes_over_the_fabric():
    x, pull = 1e9, 5 * MS  # 1 GB each way on the circuit; light lost at 5 ms
    s = Script({"a": up("b"), "b": up("a")}, {"a": [(pull, dark(pull))], "b": [(pull, dark(pull))]})
    tr = Transfer(s.view(["a", "b"]), "a", [Peer("b", x, x, BC)], BE, 0, 0)
    end = run_to_end(s, tr, step_ns=MS)
    moved = BC * pull / 1e9
    assert end == pytest.approx(pull + DETECT + (x - moved) / BE * 1e9, abs=3)
    assert tr.delivered(pull) == pytest.approx((moved, moved))
    assert tr.delivered(pull + DETECT) == pytest.approx((moved, moved))  # the stall: nothing moved
    assert tr.delivered(pull + DETECT + MS)[0] == pytest.approx(moved + BE * 1e-3)  # the fabric's rate
    # without the pull it would have ended at x / BC: the pull slowed a transfer already running
    assert end > x / BC * 1e9 * 2


def test_light_back_before_detection_ends_the_stall_and_the_trained_link_carries_again():
    x, pull, lit, active = 1e9, 5 * MS, 6 * MS, 7 * MS
    relit = lambda by: NicSnapshot(rx_los=False, rx_lol=False, light_lost_ns=pull, lit_by=by)  # noqa: E731
    changes = {k: [(pull, dark(pull)), (lit, relit(o)), (active, up(o))] for k, o in (("a", "b"), ("b", "a"))}
    s = Script({"a": up("b"), "b": up("a")}, changes)
    tr = Transfer(s.view(["a", "b"]), "a", [Peer("b", x, x, BC)], BE, 0, 0)
    end = run_to_end(s, tr, step_ns=MS // 3)
    moved = BC * pull / 1e9 + BE * (active - lit) / 1e9  # circuit, 1 ms stalled, 1 ms on the fabric
    assert end == pytest.approx(active + (x - moved) / BC * 1e9, abs=3)


def test_the_answer_does_not_depend_on_when_the_thread_runs():
    """A late or rarely-woken tool thread integrates the same due-time changes: same end, same bytes."""
    pull, back = 3 * MS, 9 * MS
    changes = {k: [(pull, dark(pull)), (back, up(o))] for k, o in (("a", "b"), ("b", "a"))}
    ends, curves = [], []
    for step in (None, 7 * MS, 250_000):
        s = Script({"a": up("b"), "b": up("a"), "c": up("d"), "d": up("c")}, changes)
        tr = Transfer(s.view(["a", "b", "c"]), "a", [Peer("b", 6e8, 6e8, BC), Peer("c", 1e8, 2e8, BC)], BE, 0, 0)
        ends.append(run_to_end(s, tr, step_ns=step))
        curves.append([v for t in range(0, ends[-1], MS // 2) for v in tr.delivered(t)])
    assert ends[0] == ends[1] == ends[2]
    assert curves[0] == pytest.approx(curves[1]) and curves[0] == pytest.approx(curves[2])


def test_a_port_that_carries_needs_light_carrier_and_active():
    assert carries(up("b"))
    assert not carries(dark(0))
    assert not carries(NicSnapshot(rx_los=False, carrier=True, ib_state="INIT"))


def test_on_the_optical_bench_a_pull_stalls_a_running_transfer_until_the_light_returns():
    """The real physics: timelines at the ground truth's due times (no dependence on wall-clock speed)."""
    import yaml

    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import PROFILE_DIR, profile_from_dict
    from devices.timing import now_ns

    data = yaml.safe_load((PROFILE_DIR / "instant.yaml").read_text())
    data["fabric"] = {"detection": {"dist": "fixed", "ms": 60_000.0}, "source": "test: slower than any test run"}
    with OpticalBench(profile_from_dict(data, "test"), seed=1) as bench:
        a, b = bench.all_nic_ports()[:2]
        bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})
        assert bench.wait_idle()
        view = FabricView(bench.nic_states, bench.nic_changes, lambda key, lost: 60_000 * MS)
        big = 1e15  # long enough to be running across the pull on any machine
        tr = Transfer(view, a.key, [Peer(b.key, big, big, BC)], BE, 0, view.start_ns)
        assert tr.projected_finish_ns() == pytest.approx(view.start_ns + big / BC * 1e9, rel=1e-9)
        bench.ocs_apply({}, removes=[a.ocs_tx, b.ocs_tx])  # the fibre pull
        assert bench.wait_idle()
        lost = max(r["t_ns"] for r in bench.ground_truth() if r["stage"] == "light_lost")
        tr.advance(now_ns())
        assert tr.delivered(lost)[0] == pytest.approx(BC * (lost - view.start_ns) / 1e9, rel=1e-6)
        assert tr.delivered(tr.t) == tr.delivered(lost)  # stalled since the pull
        assert tr.projected_finish_ns() >= lost + 60_000 * MS
        bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})  # light back: the stall ends
        assert bench.wait_idle()
        truth = bench.ground_truth()
        relit = max(r["t_ns"] for r in truth if r["stage"] == "light_detected")
        active = max(r["t_ns"] for r in truth if r["stage"] == "port_active")
        tr.advance(now_ns())
        before = tr.delivered(lost)[0]
        assert tr.delivered(relit)[0] == pytest.approx(before)
        assert tr.delivered(active)[0] == pytest.approx(before + BE * (active - relit) / 1e9, rel=1e-6)
        left = big - tr.delivered(tr.t)[0]
        assert tr.projected_finish_ns() == pytest.approx(tr.t + left / BC * 1e9, rel=1e-9)  # the circuit again


def test_a_chain_runs_back_to_back_and_a_counter_read_sees_it_whole_however_late_the_tool():
    """Iterations start where the previous ended on the fabric's time; a counter read at any instant sees
    every iteration due by then, though the tool thread never advanced it (a late thread leaves no gap)."""
    from devices.emulated.dataplane import Chain, PortCounters

    s = Script({"a": up("b"), "b": up("a")})
    counters = PortCounters()
    step = [("b", 1e8, 1e8, BC)]
    chain = counters.start(lambda t0: Chain(s.view(), "a", [step, step, step], BE, 1000, t0), lambda: 0)
    one = 1000 + 1e8 / BC * 1e9  # latency + the circuit's time
    s.now = int(10 * one)
    assert counters.at(int(2.5 * one)) == pytest.approx((2.5e8, 2.5e8), rel=1e-4)  # the third one half done
    assert chain.finish_ns is None  # integrated only up to what was read
    chain.advance(s.now)
    assert [b - a for a, b in chain.intervals()] == pytest.approx([one] * 3, abs=3)
    assert chain.intervals()[1][0] == chain.intervals()[0][1]
    assert counters.at(s.now) == pytest.approx((3e8, 3e8))
