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
    assert list(schedule.late_ns) == [900, 850, 700] and list(draw_late) == [900, 700]
    assert schedule.ran_ns == 1_300 and schedule.observed_ns == 0 and schedule.next_due() == 5_000
    assert Schedule.summary(schedule.late_ns)["max_ms"] == 900 / 1e6
    assert Schedule.summary([]) == {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
