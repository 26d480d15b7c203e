"""The emulated leaf–spine collective (devices/emulated/leafspine.py) against the fabric model it runs
(analysis/fabric.py), through flaps: its transfers' ends and its counters are the model's answer, whatever
the pattern of reads, and a shut never waits for an integration."""
import math
import threading
import types

import numpy as np
import pytest

from analysis import fabric as fb
from devices.emulated import leafspine as ls

T0 = 10**12  # the harness ns the collective starts at


class Bench:
    profile = None

    def __init__(self, n):
        self.ports = [types.SimpleNamespace(key=f"h{i}:e") for i in range(n)]

    def all_nic_ports(self):
        return self.ports


class Clock:
    def __init__(self):
        self.ns = T0

    def __call__(self):
        return self.ns


def pair_bytes(n):
    # uneven pairs: flows end at many different instants (ECMP collisions on top)
    i, j = np.indices((n, n))
    return 1e6 * (1 + 0.25 * ((i + 2 * j) % 4))


def collective(monkeypatch, n, declared, transfers, latency_ns=0, detection_s=1e-4):
    clock = Clock()
    monkeypatch.setattr(ls, "now_ns", clock)
    bench = Bench(n)
    links = ls.links_of(bench, detection_s)
    m = pair_bytes(n)
    for i, p in enumerate(bench.ports):
        plan = [[(q.key, m[i, j], m[j, i]) for j, q in enumerate(bench.ports) if q is not p]] * transfers
        group = ls.join(bench, declared, p.key, plan, latency_ns, 1.0, 400.0)
    coll = group["collective"]
    assert coll.start_ns == T0
    return coll, links, clock, [ls.RankView(coll, p.key) for p in bench.ports]


def flap(links, clock, shut, down_ns, up_ns):
    """`shut` down at T0 + down_ns and up at T0 + up_ns, stamped as fabric_link stamps them."""
    for at, up in ((down_ns, False), (up_ns, True)):
        clock.ns = T0 + at
        for link in shut:
            links.set_state(link, up)


def model_moved(topo, flows, lb, seed, states, xs):
    """Every flow's bytes moved by each instant of `xs` (s): the model's fluid over the fabric's states, each
    state solved on its own up to the next (analysis.fabric.fluid with a horizon)."""
    left = flows.bytes.astype(float).copy()
    moved = np.zeros((len(xs), len(left)))
    for k, st in enumerate(states):
        end = states[k + 1].t_s if k + 1 < len(states) else math.inf
        w = fb.route_matrix(topo, flows, lb, st.routed_out, seed)
        segments, after = fb.fluid(w, topo.capacities(st.dark), left, end - st.t_s)
        for i, x in enumerate(xs):
            if st.t_s <= x < end:
                now = left.copy()
                for a, b, rates in segments:
                    if st.t_s + a >= x:
                        break
                    now = now - rates * (min(st.t_s + b, x) - (st.t_s + a))
                moved[i] = flows.bytes - np.maximum(now, 0.0)
        left = after
    return moved


SHUT = [(0, 0, 1), (1, 2, 0), (0, 3, 0)]


@pytest.mark.parametrize("lb", ["ecmp", "spray"])
def test_a_flap_mid_transfer_is_the_models_answer(monkeypatch, lb):
    n, detection = 8, 1e-4
    declared = ls.Declared(2, 2, 2, lb, 7)
    topo = fb.LeafSpine(n, 2, 2, 2, 400.0)
    flows = fb.alltoall_flows(n, pair_bytes(n))
    intact = fb.simulate(topo, flows, lb, seed=7).max()
    down_s, up_s = 0.3 * intact, 0.7 * intact  # the links go down and up while the transfer runs
    coll, links, clock, views = collective(monkeypatch, n, declared, 1, detection_s=detection)
    flap(links, clock, SHUT, round(down_s * 1e9), round(up_s * 1e9))
    clock.ns = T0 + 10**10
    rng = np.random.default_rng(3)
    xs = np.sort(rng.uniform(0, 1.6 * intact, 60))
    got = []
    for x in xs:  # read as the counter sampler does: advance up to the instant, then read
        views[0].advance(T0 + int(x * 1e9))
        got.append([v.delivered(T0 + int(x * 1e9)) for v in views])
    views[0].advance(T0 + 10**10)
    states = fb.flap_states([(link, down_s, up_s - down_s) for link in SHUT], detection)
    moved = model_moved(topo, flows, lb, 7, states, np.floor(xs * 1e9) / 1e9)
    sent = np.stack([np.bincount(flows.pairs[:, 0], weights=m, minlength=n) for m in moved])
    recv = np.stack([np.bincount(flows.pairs[:, 1], weights=m, minlength=n) for m in moved])
    got = np.asarray(got)
    assert got[:, :, 0] == pytest.approx(sent, rel=1e-9, abs=1.0)
    assert got[:, :, 1] == pytest.approx(recv, rel=1e-9, abs=1.0)
    # every rank ends with its last flow, where the model's fluid over the same states ends it
    finish = fb.simulate(topo, flows, lb, states, seed=7)
    assert finish.max() > up_s  # the flap slowed the transfer past the restore
    for r, v in enumerate(views):
        mine = (flows.pairs[:, 0] == r) | (flows.pairs[:, 1] == r)
        (start, end), = v.intervals()
        assert start == T0 and abs(end - T0 - finish[mine].max() * 1e9) <= 2


def test_counters_and_ends_do_not_depend_on_when_they_are_read(monkeypatch):
    # the same collective and flap, integrated in one go and read at scattered instants (a busy machine):
    # the same transfers' intervals and the same counters at every instant — including the latency gaps
    # between transfers, where a rank moves nothing
    declared = ls.Declared(2, 2, 2, "ecmp", 11)
    runs = []
    for reads in (False, True):
        coll, links, clock, views = collective(monkeypatch, 8, declared, 5, latency_ns=30_000)
        flap(links, clock, SHUT[:2], 250_000, 900_000)
        clock.ns = T0 + 10**10
        if reads:
            for t in np.sort(np.random.default_rng(5).integers(0, 2_000_000, 300)):
                views[int(t) % 8].advance(T0 + int(t))
        views[0].advance(T0 + 10**10)
        grid = T0 + np.arange(0, 2_500_000, 7_000)
        runs.append(([v.intervals() for v in views], [[v.delivered(int(t)) for t in grid] for v in views]))
    (ends_a, bytes_a), (ends_b, bytes_b) = runs
    assert ends_a == ends_b
    assert np.asarray(bytes_a) == pytest.approx(np.asarray(bytes_b), rel=1e-12, abs=1e-6)
    # a rank's counter is flat from its transfer's end through the barrier (every rank's end) and the latency
    (s0, e0), (s1, _) = ends_a[0][:2]
    assert s1 == max(v[0][1] for v in ends_a)
    sent = np.asarray(bytes_a)[0, :, 0]
    grid = np.arange(0, 2_500_000, 7_000)
    flat = (grid >= e0 - T0) & (grid <= s1 + 30_000 - T0)
    assert flat.any() and np.ptp(sent[flat]) < 1e-6


def test_a_shut_never_waits_for_an_integration(monkeypatch):
    # fabric_link stamps its change under the links' lock; an integration (a max-min solve, seconds on a busy
    # machine) holds the collective's own: a shut line's span is the shell's, not the solver's
    coll, links, clock, views = collective(monkeypatch, 8, ls.Declared(2, 2, 2, "ecmp", 1), 2)
    done = threading.Event()
    with coll.lock:  # an integration in progress
        threading.Thread(target=lambda: (links.set_state((0, 0, 0), False), done.set()), daemon=True).start()
        assert done.wait(30)
    assert links.state(clock.ns)[0] == {(0, 0, 0)}


def test_the_emulated_host_clocks_inverse_is_exact():
    # the oracle puts a counter sample's host stamp back on the harness clock through the emulated clock's own
    # inverse: every host of a drifting, offset pod, far from and near the clocks' origin
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile
    from harness.bench.emulated import harness_ns

    with OpticalBench(load_profile("spectrumx-pod"), seed=3) as bench:
        emulated = types.SimpleNamespace(physics=bench)
        for host in bench.hosts:
            assert bench.host_clock_params(host)["drift_ppm"] != 0
            for t in (T0, T0 + 123_456_789, T0 + 3_600 * 10**9 + 7, 5 * 10**9):
                assert harness_ns(emulated, host, bench.host_time(host, t)) == t
