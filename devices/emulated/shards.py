"""Emulated hosts served by worker processes over one physics (a pod on a few cores).

One interpreter serving hundreds of paramiko SSH servers spends its single GIL on every host's crypto and
threads. `EmulatedBench(..., workers=N)` keeps the physics, the OCS servers, the inventory and the ground
truth in the bench's process and runs the hosts' SSH servers (and the agents' host sides) in N worker
processes, hosts dealt round-robin. A worker sees the physics through `PhysicsView`, the interface the host
servers use anyway:
- static facts (NIC models, the profile) are copied at start; host clocks are computed locally from the
  physics' clock parameters (CLOCK_MONOTONIC is shared by every process on one machine); a clock step is
  in force on the worker before `step_host_clock` returns;
- every read (`nic_snapshot`, `ocs_patches`, ...) and every probe start/stop is a call into the physics
  process, which runs what is due first, exactly as a local reader does;
- the physics' changes for the worker's hosts are pushed in batches and fanned out to the local
  subscribers (watch, ip monitor, probe-recv). Each change carries its due time, so delivery through the
  pipe delays when a line is printed, never the time it reports.
The drivers cannot tell: each host is still a real SSH server on 127.0.0.1.

Wire: two `multiprocessing.connection` channels per worker on socket pairs (pickle). `calls` (worker →
physics: method, args → ("ok", value) | ("error", exception)); `pushes` (physics → worker: change batches,
control requests — clock steps, fault injection — which the worker answers on it).
Workers are `python -m devices.emulated.shards FD FD`: an exec'd interpreter, not a fork of a threaded one.
"""
from __future__ import annotations

import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from devices.resources import HostResource

# What a worker may ask the physics: the readers and actions the host servers use.
PHYSICS_CALLS = frozenset({"nic_snapshot", "nic_snapshots", "nic_states", "nic_changes", "ocs_patches",
                           "probe_start", "probe_stop", "probe_flow", "set_admin"})
_BATCH = 4096  # changes per push message at most
_START_TIMEOUT_S = 120.0


class WorkerError(RuntimeError):
    """A host worker failed to start or died."""


# ============================================================================ bench side


class RemoteHost:
    """A host served by a worker, as the bench and fault injection see it (`EmulatedHostServer`'s facts and
    its fault hooks)."""

    def __init__(self, worker: "HostWorker", host_name: str, facts: dict):
        self._worker = worker
        self.host_name = host_name
        self.port = facts["port"]
        self.user = facts["user"]
        self.client_key_path = Path(facts["client_key_path"])
        self.known_hosts_path = Path(facts["known_hosts_path"])
        self._reply_delay_s = 0.0

    def resource(self) -> HostResource:
        return HostResource(name=self.host_name, address="127.0.0.1", port=self.port, user=self.user,
                            identity_file=str(self.client_key_path), known_hosts=str(self.known_hosts_path),
                            strict_host_key=False)

    @property
    def reply_delay_s(self) -> float:
        return self._reply_delay_s

    @reply_delay_s.setter
    def reply_delay_s(self, seconds: float) -> None:
        self._worker.control("reply_delay_s", self.host_name, float(seconds))
        self._reply_delay_s = float(seconds)

    def drop_connections(self) -> int:
        return self._worker.control("drop_connections", self.host_name)

    def stop(self) -> None:  # the worker stops its hosts together (HostWorker.stop)
        pass


class HostWorker:
    """One worker process serving `hosts` over `physics`."""

    def __init__(self, physics, hosts: list[str], index: int):
        self.physics, self.hosts, self.index = physics, list(hosts), index
        self.process: subprocess.Popen | None = None
        self._calls: Connection | None = None
        self._pushes: Connection | None = None
        self._send_lock = threading.Lock()
        self._changes: queue.SimpleQueue = queue.SimpleQueue()
        self._replies: dict[int, queue.SimpleQueue] = {}
        self._ids = itertools.count(1)
        self._unsubscribe: list = []
        self._threads: list[threading.Thread] = []
        self.remote: dict[str, RemoteHost] = {}

    def launch(self) -> None:
        """Start the process (its interpreter imports while the other workers start)."""
        calls, calls_child = socket.socketpair()
        pushes, pushes_child = socket.socketpair()
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "devices.emulated.shards", str(calls_child.fileno()), str(pushes_child.fileno())],
            pass_fds=(calls_child.fileno(), pushes_child.fileno()), env=env, stdin=subprocess.DEVNULL)
        calls_child.close()
        pushes_child.close()
        self._calls, self._pushes = Connection(calls.detach()), Connection(pushes.detach())
        physics = self.physics
        self._pushes.send({
            "hosts": self.hosts, "profile": physics.profile,
            "models": {h: physics.nic_ports(h) for h in self.hosts}, "all_models": physics.all_nic_ports(),
            "clocks": {h: physics.host_clock_params(h) for h in self.hosts},
        })

    def ready(self) -> dict[str, RemoteHost]:
        """Wait for the worker's hosts to listen; then serve its calls and push its hosts' changes."""
        if not self._pushes.poll(_START_TIMEOUT_S):
            raise WorkerError(f"host worker {self.index} did not start within {_START_TIMEOUT_S:.0f} s")
        try:
            kind, facts = self._pushes.recv()
        except EOFError:
            raise WorkerError(f"host worker {self.index} exited while starting "
                              f"(status {self.process.wait()})") from None
        if kind != "ready":
            raise WorkerError(f"host worker {self.index} failed to start: {facts}")
        self.remote = {h: RemoteHost(self, h, facts[h]) for h in self.hosts}
        for host in self.hosts:
            self._unsubscribe.append(self.physics.subscribe(host, self._changes.put))
        for target, name in ((self._serve_calls, "calls"), (self._push_changes, "push"),
                             (self._read_replies, "replies")):
            thread = threading.Thread(target=target, name=f"host-worker{self.index}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self.remote

    def _send(self, message) -> None:
        with self._send_lock:
            self._pushes.send(message)

    def _serve_calls(self) -> None:
        while True:
            try:
                method, args = self._calls.recv()
            except (EOFError, OSError):
                return
            try:
                if method not in PHYSICS_CALLS:
                    raise AttributeError(f"the physics does not serve {method!r} to host workers")
                reply = ("ok", getattr(self.physics, method)(*args))
            except Exception as exc:  # the worker's caller gets the physics' own exception
                reply = ("error", exc)
            try:
                self._calls.send(reply)
            except (OSError, ValueError):
                return

    def _push_changes(self) -> None:
        while True:
            batch = [self._changes.get()]
            if batch[0] is None:
                return
            while len(batch) < _BATCH:
                try:
                    change = self._changes.get_nowait()
                except queue.Empty:
                    break
                if change is None:
                    self._changes.put(None)
                    break
                batch.append(change)
            try:
                self._send(("changes", batch))
            except (OSError, ValueError):
                return

    def _read_replies(self) -> None:
        while True:
            try:
                _, request, value = self._pushes.recv()
            except (EOFError, OSError):
                for waiting in list(self._replies.values()):
                    waiting.put(("error", WorkerError(f"host worker {self.index} exited")))
                return
            waiting = self._replies.pop(request, None)
            if waiting is not None:
                waiting.put(value)

    def control(self, op: str, host: str, *args, timeout_s: float = 30.0):
        """Run a fault-injection hook on a worker's host and return its result."""
        request = next(self._ids)
        waiting = self._replies[request] = queue.SimpleQueue()
        self._send(("control", request, op, host, args))
        try:
            status, value = waiting.get(timeout=timeout_s)
        except queue.Empty:
            raise WorkerError(f"host worker {self.index} did not answer {op} for {host}") from None
        if status == "error":
            raise value
        return value

    def push_clock(self, host: str) -> None:
        """The host's clock parameters changed (a step): in force on the worker when this returns."""
        if host in self.remote:
            self.control("set_clock", host, self.physics.host_clock_params(host))

    def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        self._changes.put(None)
        if self._pushes is not None:
            try:
                self._send(("stop",))
            except (OSError, ValueError):
                pass
        if self.process is not None:
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for conn in (self._calls, self._pushes):
            if conn is not None:
                conn.close()
        for thread in self._threads:
            thread.join(timeout=5)


class HostWorkers:
    """`workers` processes serving the physics' hosts, dealt round-robin; `hosts` maps a name to its
    `RemoteHost`."""

    def __init__(self, physics, workers: int):
        if workers < 1:
            raise ValueError("host workers must be >= 1")
        hosts = list(physics.hosts)
        self.workers = [HostWorker(physics, hosts[i::workers], i) for i in range(min(workers, len(hosts)))]
        self.hosts: dict[str, RemoteHost] = {}

    def start(self) -> dict[str, RemoteHost]:
        try:
            for worker in self.workers:
                worker.launch()
            for worker in self.workers:
                self.hosts.update(worker.ready())
        except BaseException:
            self.stop()
            raise
        return {h: self.hosts[h] for h in self.workers[0].physics.hosts if h in self.hosts}

    def clock_stepped(self, host: str) -> None:
        for worker in self.workers:
            worker.push_clock(host)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


# ============================================================================ worker side


class PhysicsView:
    """The physics as a worker's host servers see it: the `OpticalBench` methods they use."""

    def __init__(self, spec: dict, calls: Connection):
        from devices.emulated.physics import HostClock

        self.profile = spec["profile"]
        self.hosts = spec["hosts"]
        self._models = spec["models"]
        self._all_models = spec["all_models"]
        self._clocks = {h: HostClock(p["epoch_ns"], p["offset_ns"], p["drift_ppm"], p["t0_ns"])
                        for h, p in spec["clocks"].items()}
        self._calls = calls
        self._call_lock = threading.Lock()
        from devices.emulated.nic import Subscribers

        self._subs = Subscribers()

    def _call(self, method: str, *args):
        with self._call_lock:
            self._calls.send((method, args))
            status, value = self._calls.recv()
        if status == "error":
            raise value
        return value

    # the physics' readers and actions
    def nic_snapshot(self, host, netdev):
        return self._call("nic_snapshot", host, netdev)

    def nic_snapshots(self, host):
        return self._call("nic_snapshots", host)

    def nic_states(self):
        return self._call("nic_states")

    def nic_changes(self, since_ns):
        return self._call("nic_changes", since_ns)

    def ocs_patches(self):
        return self._call("ocs_patches")

    def set_admin(self, host, netdev, up):
        return self._call("set_admin", host, netdev, up)

    def probe_start(self, host, netdev, interval_ns):
        return self._call("probe_start", host, netdev, interval_ns)

    def probe_stop(self, host, netdev):
        return self._call("probe_stop", host, netdev)

    def probe_flow(self, host, netdev):
        return self._call("probe_flow", host, netdev)

    # static facts and local clocks
    def nic_ports(self, host):
        return list(self._models.get(host, ()))

    def all_nic_ports(self):
        return list(self._all_models)

    def host_time(self, host, mono_ns):
        return self._clocks[host].at(mono_ns)

    def host_clock_ns(self, host):
        from devices.timing import now_ns

        return self._clocks[host].at(now_ns())

    def host_clock_params(self, host):
        c = self._clocks[host]
        return {"offset_ns": c.offset_ns + c.step_ns, "drift_ppm": c.drift_ppm, "t0_ns": c.t0_ns,
                "epoch_ns": c.epoch_ns}

    def set_clock(self, host, params) -> None:
        from devices.emulated.physics import HostClock

        self._clocks[host] = HostClock(params["epoch_ns"], params["offset_ns"], params["drift_ppm"],
                                       params["t0_ns"])

    # pushed changes
    def subscribe(self, host, callback):
        return self._subs.add(host, callback)

    def deliver(self, changes) -> None:
        self._subs.deliver(changes, self._subs.snapshot())


def _worker_main(calls_fd: int, pushes_fd: int) -> int:
    import signal

    from devices.emulated.host.server import EmulatedHostServer

    # A terminal's Ctrl-C reaches the whole process group: the bench stops its workers over the pipe (and a
    # closed pipe stops them too), so the worker neither dies mid-stop nor prints a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    calls, pushes = Connection(calls_fd), Connection(pushes_fd)
    spec = pushes.recv()
    view = PhysicsView(spec, calls)
    servers: dict[str, EmulatedHostServer] = {}
    try:
        for host in spec["hosts"]:
            servers[host] = EmulatedHostServer(view, host).start()
        pushes.send(("ready", {h: {"port": s.port, "user": s.user, "client_key_path": str(s.client_key_path),
                                   "known_hosts_path": str(s.known_hosts_path)} for h, s in servers.items()}))
    except Exception as exc:
        pushes.send(("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    reply_lock = threading.Lock()

    def control(request: int, op: str, host: str, args: tuple) -> None:
        try:
            server = servers[host]
            if op == "set_clock":
                view.set_clock(host, args[0])
                value = ("ok", None)
            elif op == "reply_delay_s":
                server.reply_delay_s = args[0]
                value = ("ok", None)
            elif op == "drop_connections":
                value = ("ok", server.drop_connections())
            else:
                raise ValueError(f"unknown control {op!r}")
        except Exception as exc:
            value = ("error", exc)
        with reply_lock:
            pushes.send(("reply", request, value))

    try:
        while True:
            try:
                message = pushes.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "changes":
                view.deliver(message[1])
            elif kind == "control":  # off the push loop: dropping connections may take a while
                threading.Thread(target=control, args=message[1:], daemon=True).start()
            elif kind == "stop":
                break
    finally:
        for server in servers.values():
            try:
                server.stop()
            except Exception:  # stop every host
                pass
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker_main(int(sys.argv[1]), int(sys.argv[2])))
