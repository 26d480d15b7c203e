"""The streaming agent subcommands' output, served by one thread per host (`AgentStreams`)."""
from __future__ import annotations

import heapq
import itertools
import queue
import threading
from typing import TYPE_CHECKING, Callable

from devices.emulated.host.context import ChannelGone, ExecContext
from devices.timing import now_ns

if TYPE_CHECKING:
    from devices.emulated.host.server import EmulatedHostServer


class AgentStreams:
    """A host's streaming agent subcommands (`watch`, `probe-recv`) served by one thread of the host's.

    The host's changes come from the physics through ONE subscription into one queue (a C call on the physics'
    delivery thread, no Python callback per stream); each change goes to the streams that watch its port and
    field, which say when its line is due (a watch: its next poll tick; a probe receiver: at once); the thread
    writes each stream's due lines in one write. A command's own thread only waits for its stdin's EOF, so a
    stream costs no wake-ups while nothing changes and a burst of changes wakes one thread per host instead of
    one per stream. What a line says and when it is stamped is each stream's (`_WatchStream`,
    `_ProbeRecvStream`); only who writes it is shared. One thread per host, not per process: a host whose
    client stops reading (a full SSH window) or that is made slow (`reply_delay_s`) holds up its own
    streams only, as on a real bench."""

    _EMPTY = object()

    def __init__(self, server: "EmulatedHostServer"):
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], tuple] = {}  # (netdev, field) -> streams; replaced, never mutated
        self._unsubscribe = server.bench.subscribe(server.host_name, self._inbox.put)
        threading.Thread(target=self._run, name=f"ssh-{server.host_name}-agent", daemon=True).start()

    def add(self, stream) -> None:
        """From now on `stream` gets the changes of its (netdev, field) keys, each due at the first tick of
        `stream.grid(field)` = (origin, step) at or after it (step 0: at once)."""
        with self._lock:
            routes = dict(self._routes)
            for key in stream.keys:
                routes[key] = routes.get(key, ()) + ((stream, *stream.grid(key[1])),)
            self._routes = routes

    def routed(self, netdev: str, field: str) -> bool:
        """Whether some stream now gets the changes of (netdev, field)."""
        return bool(self._routes.get((netdev, field)))

    def remove(self, stream) -> None:
        """No change reaches `stream` and nothing is written to it once this returns."""
        with self._lock:
            routes = dict(self._routes)
            for key in stream.keys:
                routes[key] = tuple(r for r in routes.get(key, ()) if r[0] is not stream)
            self._routes = routes
        with stream.write_lock:
            stream.closed = True

    def arm(self, change) -> None:
        """A stream's own timer: `change` is routed as a physics change (due at its `t_ns` on a step-0 grid)."""
        self._inbox.put(change)

    def close(self) -> None:
        self._unsubscribe()
        self._inbox.put(None)

    def _run(self) -> None:
        inbox, due, seq, empty = self._inbox, [], itertools.count(), self._EMPTY
        while True:
            if not due:
                change = inbox.get()
            else:
                wait = (due[0][0] - now_ns()) / 1e9
                try:
                    change = inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait()
                except queue.Empty:
                    change = empty
            now = now_ns()
            ready: dict = {}  # stream -> its (due ns, change) due by now, in arrival order: the heap's first
            while due and due[0][0] <= now:
                at, _, stream, item = heapq.heappop(due)
                ready.setdefault(stream, []).append((at, item))
            while change is not empty:  # everything already queued
                if change is None:
                    return
                # the routes as of this change: a stream added since reads its first values after adding
                for stream, origin, step in self._routes.get((change.netdev, change.field), ()):
                    t = change.t_ns
                    at = origin + -(-(t - origin) // step) * step if step else t  # its tick, or at once
                    if at > now:
                        heapq.heappush(due, (at, next(seq), stream, change))
                    elif stream in ready:
                        ready[stream].append((at, change))
                    else:
                        ready[stream] = [(at, change)]
                try:
                    change = inbox.get_nowait()
                except queue.Empty:
                    change = empty
            for stream, items in ready.items():
                items.sort(key=_due)  # stable: changes due at one tick stay in arrival order
                stream.write(items)


def _due(item: tuple) -> int:
    return item[0]


class Stream:
    """One agent stream's output, written by its host's `AgentStreams` thread (or, for its first lines, by
    its command's thread, holding `write_lock` so nothing overtakes them)."""

    keys: tuple[tuple[str, str], ...] = ()

    def __init__(self, ctx: ExecContext):
        self.ctx = ctx
        self.write_lock = threading.Lock()
        self.closed = False

    def write(self, items: list) -> None:
        with self.write_lock:
            if self.closed:
                return
            text = self.lines(items)
            if text:
                try:
                    self.ctx.out(text)
                except ChannelGone:
                    self.closed = True  # its command's thread sees the channel close and ends

    def serve(self, first_lines: Callable[[], str]) -> int:
        """Register, write `first_lines()` (read after registering: no change can fall between), then wait
        for stdin's EOF or the client going away."""
        streams = self.ctx.server.agent_streams()
        self.write_lock.acquire()
        try:
            streams.add(self)
            text = first_lines()
            if text:
                self.ctx.out(text)
        except BaseException:  # the channel gone, or a bug: never left registered (remove takes the lock)
            self.write_lock.release()
            streams.remove(self)
            raise
        self.write_lock.release()
        try:
            self.ctx.wait_stdin_eof_or_gone()
        finally:
            streams.remove(self)
        return 0
