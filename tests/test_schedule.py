"""The schedule on its own: due order, each action run with its due time, follow-ups of a late pass run in it."""
import threading
from array import array

from devices.emulated.schedule import Schedule


def test_a_late_pass_runs_everything_due_in_due_order_with_due_times_and_records_lateness():
    now = [1_000]
    draw_late = array("q", [0, 0])
    wake = threading.Condition()  # its lock held around every call, as OpticalBench holds its own
    schedule = Schedule(lambda: now[0], wake, draw_late)
    ran = []

    def follow_up(t):
        ran.append(("follow_up", t))

    def first(t):
        ran.append(("first", t))
        schedule.at(t + 50, follow_up)  # timed from the due time, not from when it ran

    with wake:
        schedule.at(1_300, lambda t: ran.append(("later", t)), draw=1)
        schedule.at(1_100, first, draw=0)
        schedule.at(5_000, lambda t: ran.append(("not yet", t)))
        now[0] = 2_000  # the pass comes 900 ns after the first action was due
        schedule.run_due(observed=False)
    assert ran == [("first", 1_100), ("follow_up", 1_150), ("later", 1_300)]
    # in process every change shows at its due time: the draws were realised as drawn
    assert list(schedule.late_ns) == [900, 850, 700] and list(draw_late) == [0, 0]
    assert schedule.ran_ns == 1_300 and schedule.observed_ns == 0 and schedule.next_due() == 5_000
    assert Schedule.summary(schedule.late_ns)["max_ms"] == 900 / 1e6
    assert Schedule.summary([]) == {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}


def test_a_draw_is_realised_late_by_its_chain_s_late_start_and_on_a_kernel_bench_by_its_late_run():
    now = [1_000]
    draw_late = array("q", [0, 0, 0, 0])
    wake = threading.Condition()
    schedule = Schedule(lambda: now[0], wake, draw_late)
    with wake:
        schedule.at(1_100, lambda t: None, draw=0, late_ns=40)  # its chain started 40 ns after the command came
        schedule.at(1_200, lambda t: None, draw=1)
        assert list(draw_late) == [40, 0, 0, 0]  # known when scheduled, before it runs
        now[0] = 1_500
        schedule.run_due()
        assert list(draw_late) == [40, 0, 0, 0]
        schedule.realised_when_run = True  # a kernel shows each change when its action ran
        schedule.at(1_600, lambda t: None, draw=2, late_ns=40)
        schedule.at(1_700, lambda t: None, draw=3)
        now[0] = 2_000
        schedule.run_due()
    assert list(draw_late) == [40, 0, 40 + 400, 300]


def test_the_lateness_summary_is_numpy_s_quantiles_and_holds_one_copy_of_a_campaign_s_values():
    import tracemalloc

    import numpy as np

    rng = np.random.default_rng(7)
    late = rng.integers(0, 5_000_000, 1_000_000)
    kept = late.copy()
    expected = {"n": late.size, "p50_ms": float(np.quantile(kept, 0.5)) / 1e6,
                "p99_ms": float(np.quantile(kept, 0.99)) / 1e6, "max_ms": float(kept.max()) / 1e6}
    assert Schedule.summary(late) == expected
    assert np.array_equal(late, kept)  # not the caller's scratch: left as it was
    tracemalloc.start()
    try:
        assert Schedule.summary(late, scratch=True) == expected
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < late.nbytes / 4  # reordered in place: no copy of the values (a column's own copy is the one)
