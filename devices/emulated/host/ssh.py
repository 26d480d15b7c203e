"""SSH plumbing of the emulated servers (the hosts and the NETCONF switch): host keys, server transports on the
process's SSH hub, and the threads every emulated host of a process shares.

Channel lifecycle (shared spec feasibility.md §1): a handler ends by sending exit status + EOF and lets
the client close; closing from the handler can overtake paramiko's exec reply and fail the command.
A reaper closes channels the client leaves open (e.g. a stock `ssh` whose stdin stays open).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from devices.sshhub import HubTransport

if TYPE_CHECKING:
    from devices.emulated.host.server import EmulatedHostServer

log = logging.getLogger(__name__)


CLOSE_AFTER_S = 0.25  # then the reaper closes a finished channel the client left open (stock ssh waits for it)


def generate_ed25519(path: Path) -> paramiko.Ed25519Key:
    """A fresh Ed25519 key in OpenSSH format (mode 600). paramiko has no Ed25519 generate()."""
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM,
                                                     serialization.PrivateFormat.OpenSSH,
                                                     serialization.NoEncryption())
    path.write_bytes(pem)
    os.chmod(path, 0o600)
    return paramiko.Ed25519Key(filename=str(path))


def forget_accepted(channel: paramiko.Channel) -> None:
    """Drop this channel from paramiko's queue of channels awaiting `Transport.accept()` (we never call
    it), or the queue grows by one per command. `accept()` itself would pop *other* channels, whose only
    strong reference that queue is until their exec request arrives: paramiko's __del__ then closes them."""
    transport = channel.get_transport()
    queue_ = getattr(transport, "server_accepts", None)
    if transport is None or queue_ is None:
        return
    with transport.lock:
        try:
            queue_.remove(channel)
        except ValueError:
            pass


def server_transport(sock: socket.socket, host_key: paramiko.PKey, interface: paramiko.ServerInterface,
                     subsystems: dict[str, tuple] | None = None) -> paramiko.Transport | None:
    """An SSH server transport (TCP_NODELAY) on an accepted connection; its loop runs on the process's SSH
    hub (devices.sshhub: one thread for every connection). `subsystems`: name -> (handler class, *args), as
    paramiko's set_subsystem_handler takes them. None if it cannot start."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = HubTransport(sock)
    interface.transport = transport  # what the connection has open, for the interface's limits (MaxSessions)
    transport.add_server_key(host_key)
    for name, (handler, *args) in (subsystems or {}).items():
        transport.set_subsystem_handler(name, handler, *args)
    try:
        transport.start_server(event=threading.Event(), server=interface)
    except (paramiko.SSHException, OSError, EOFError):
        transport.close()
        return None
    return transport


def accept_ssh(listener: socket.socket, host_key: paramiko.PKey, interface: Callable[[], paramiko.ServerInterface],
               running: Callable[[], bool]) -> Iterator[paramiko.Transport]:
    """SSH server transports for each connection whose handshake starts, until `running()` turns false or
    the listener is closed."""
    while running():
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        transport = server_transport(sock, host_key, interface())
        if transport is not None:
            yield transport


class HostsLoop:
    """What every emulated host of a process shares, so a pod costs no thread per host for them: one thread
    accepting on all hosts' listeners (a selector), one closing the channels clients leave open, and a pool of
    command threads (the connections themselves are on the SSH hub, devices.sshhub).

    A command runs on an idle pool thread, handed over by a queue: the hub that received the exec request
    never waits for a thread to start (a start waits until the new thread gets the GIL, and the hub serves
    every host's connection), and a short command costs one hand-off, not a thread's creation. Only when
    every pool thread is busy does the starter thread add one; threads idle for `_IDLE_S` leave the pool."""

    _IDLE_S = 30.0

    _instance: "HostsLoop | None" = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> "HostsLoop":
        with cls._instance_lock:
            if cls._instance is None or cls._instance.pid != os.getpid():  # a forked child has no threads
                cls._instance = cls()
            return cls._instance

    def __init__(self):
        self.pid = os.getpid()
        self._selector = selectors.DefaultSelector()
        self._idle = socket.socketpair()  # keeps the selector non-empty: select() blocks, never spins
        self._selector.register(self._idle[0], selectors.EVENT_READ, None)
        self._reap: list[tuple[float, int, paramiko.Channel]] = []
        self._reap_cv = threading.Condition()
        self._reap_seq = itertools.count()
        self._starts: queue.SimpleQueue = queue.SimpleQueue()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._pool_lock = threading.Lock()
        self._spare = 0  # pool threads waiting for a command and not yet promised one (waiting - queued)
        threading.Thread(target=self._accept_loop, name="ssh-hosts-accept", daemon=True).start()
        threading.Thread(target=self._reap_loop, name="ssh-hosts-reaper", daemon=True).start()
        threading.Thread(target=self._start_loop, name="ssh-hosts-starter", daemon=True).start()

    def listen(self, listener: socket.socket, host: "EmulatedHostServer") -> None:
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, host)

    def unlisten(self, listener: socket.socket) -> None:
        try:
            self._selector.unregister(listener)
        except (KeyError, ValueError):
            pass

    def _accept_loop(self) -> None:
        while True:
            try:
                ready = self._selector.select()
            except OSError:  # a listener closed under us; the next round sees the map without it
                continue
            for key, _ in ready:
                try:
                    sock, _ = key.fileobj.accept()
                except (BlockingIOError, OSError):
                    continue
                sock.setblocking(True)
                key.data._accepted(sock)

    def run_command(self, target: Callable, args: tuple, name: str) -> None:
        """Run `target(*args)` on a pool thread (named `name` while it runs); never waits."""
        with self._pool_lock:
            spare = self._spare > 0
            if spare:
                self._spare -= 1
        self._commands.put((target, args, name))
        if not spare:
            self._starts.put(None)  # one more pool thread, for this command

    def _start_loop(self) -> None:
        while True:
            self._starts.get()
            threading.Thread(target=self._pool_thread, daemon=True, name="ssh-hosts-command").start()

    def _pool_thread(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                target, args, name = self._commands.get(timeout=self._IDLE_S)
            except queue.Empty:
                with self._pool_lock:
                    if self._spare > 0:  # else a command is promised to a waiting thread: maybe this one
                        self._spare -= 1
                        return
                continue
            me.name = name
            try:
                target(*args)
            except BaseException:  # a command's failure must not shrink the pool unnoticed
                log.exception("emulated host command thread")
            me.name = "ssh-hosts-command"
            with self._pool_lock:
                self._spare += 1

    def close_later(self, channel: paramiko.Channel) -> None:
        with self._reap_cv:
            heapq.heappush(self._reap, (time.monotonic() + CLOSE_AFTER_S, next(self._reap_seq), channel))
            if len(self._reap) == 1:  # the reaper waits for an earlier deadline, or for nothing: wake it only then
                self._reap_cv.notify()

    def _reap_loop(self) -> None:
        while True:
            with self._reap_cv:
                while not self._reap or self._reap[0][0] > time.monotonic():
                    self._reap_cv.wait(None if not self._reap else self._reap[0][0] - time.monotonic())
                now = time.monotonic() + CLOSE_AFTER_S / 5  # those due soon too: one wake-up per batch of
                due = []  # commands, not per command
                while self._reap and self._reap[0][0] <= now:
                    due.append(heapq.heappop(self._reap)[2])
            for channel in due:
                channel.close()
