"""Bench lock: a lease per OCS, so two runs never drive the same switch.

A lease is a small JSON file `<dir>/<key>.json` (owner, host, pid, run id, expiry in wall-clock seconds,
a random token). It is taken only if absent, expired, or left by a dead process on this machine, and a
keep-alive thread renews it every ttl/3 — so a crashed run (SIGKILL, power loss) holds the bench for at
most `ttl_s`, never forever. Check-and-write happens under an flock on `<key>.guard`, so two runs on one
machine cannot both win; put the directory (`OCS_HIL_LOCK_DIR`) on a shared file system to lock across
machines. Emulated benches skip the lock (each run has its own switch).
"""
from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import getpass
import json
import os
import re
import secrets
import socket
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

LOCK_DIR_ENV = "OCS_HIL_LOCK_DIR"
TTL_ENV = "OCS_HIL_LEASE_TTL_S"
DEFAULT_TTL_S = 60.0


class BenchLocked(Exception):
    """Another live run holds the lease; the message names it and when the lease expires."""


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or Path.home() / ".cache" / "ocs-hil" / "locks")


def lease_ttl() -> float:
    """The station's lease time-to-live: `OCS_HIL_LEASE_TTL_S`, default 60 s."""
    text = os.environ.get(TTL_ENV, "")
    try:
        ttl = float(text) if text else DEFAULT_TTL_S
    except ValueError:
        raise ValueError(f"{TTL_ENV}={text!r}: expected a number of seconds") from None
    if not ttl > 0:
        raise ValueError(f"{TTL_ENV}={text!r}: expected a positive number of seconds")
    return ttl


def _file_key(text: str) -> str:
    return "ocs-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", text.strip().lower()).strip("_")


def _canonical_address(address: str) -> str:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.compressed


def endpoint_names(url: str, protocol: str) -> list[str]:
    """Where a switch URL leads, never its spelling: every address its host resolves to with the port
    (`localhost:P` and `127.0.0.1:P` share `127.0.0.1:P`), or a serial line's real device path. A host that
    does not resolve keeps its lower-cased name (it cannot be reached, so it cannot be shared either)."""
    from devices.ocs import parse_url

    endpoint = parse_url(url, protocol)
    if endpoint.kind == "serial":
        scheme, sep, rest = endpoint.url.partition("://")
        if not sep:
            return [os.path.realpath(endpoint.url)]
        host, colon, port = rest.split("?", 1)[0].strip("/").rpartition(":")
        if not (colon and port.isdigit() and scheme.lower() in ("socket", "rfc2217")):
            return [endpoint.url.strip().lower()]
        endpoint = type(endpoint)(scheme, host=host.strip("[]"), port=int(port))
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
        addresses = sorted({_canonical_address(info[4][0]) for info in infos})
    except (OSError, ValueError, UnicodeError):
        addresses = [endpoint.host.lower()]
    return [f"{a}:{endpoint.port}" for a in addresses]


def endpoint_keys(url: str, protocol: str) -> list[str]:
    """The lease keys of a switch URL: one per resolved endpoint, so any two names of one switch share at
    least one key and cannot both be leased (BenchLease takes all or none)."""
    return [_file_key(name) for name in endpoint_names(url, protocol)]


def ocs_lease_keys(resource) -> list[str]:
    """The lease keys of one switch (`OcsResource`)."""
    return endpoint_keys(resource.url, resource.protocol)


# Protocols whose identity answer carries the unit's serial as its third comma-separated field: SCPI's
# IEEE 488.2 `*IDN?` (manufacturer,model,serial,firmware) and the NETCONF driver's product-information.
# TL1's RTRV-NETYPE names vendor, model, type and release, no serial: no identity key there.
SERIAL_IN_IDENTITY = ("polatis-scpi", "polatis-netconf")


def ocs_identity_key(protocol: str, identity: str) -> str | None:
    """The lease key of a switch's own identity (manufacturer, model, serial): the same unit reached over
    two routes no resolver can relate (two management addresses). None where the answer has no serial."""
    fields = [f.strip().strip('"') for f in (identity or "").split(",")]
    if protocol not in SERIAL_IN_IDENTITY or len(fields) < 3 or not fields[2].strip("0 -"):
        return None
    digest = hashlib.sha256(",".join(fields[:3]).lower().encode()).hexdigest()[:16]
    return f"ocs-id-{digest}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@contextmanager
def _guard(directory: Path, key: str):
    with open(directory / f"{key}.guard", "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_lease(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as expired (it cannot name a live owner)
    return data if isinstance(data, dict) else {}


def lease_is_live(lease: dict | None, now: float | None = None) -> bool:
    """Held by someone: not expired, and not left by a dead process on this very machine."""
    if not lease:
        return False
    now = time.time() if now is None else now
    if float(lease.get("expires", 0)) <= now:
        return False
    if lease.get("hostname") == socket.gethostname() and isinstance(lease.get("pid"), int):
        return _pid_alive(lease["pid"])
    return True


def _held_by(key: str, lease: dict) -> str:
    until = datetime.fromtimestamp(float(lease["expires"]), timezone.utc)
    return (f"{key} is in use by {lease.get('owner', '?')} (run {lease.get('run_id') or '?'}); its lease expires "
            f"{until.isoformat(timespec='seconds')} unless renewed")


def live_holder(keys: list[str], directory: str | os.PathLike | None = None) -> str | None:
    """Who holds a live lease on any of `keys` (the message BenchLocked would carry), or None: a look
    without taking anything, for a caller that waits its turn before it starts a run."""
    directory = Path(directory) if directory is not None else lock_dir()
    for key in sorted(set(keys)):
        current = read_lease(directory / f"{key}.json")
        if lease_is_live(current):
            return _held_by(key, current)
    return None


class BenchLease:
    """Leases on `keys` (all or none). `with BenchLease([...], run_id=...):` or acquire()/release()."""

    def __init__(self, keys: list[str], *, run_id: str = "", ttl_s: float = DEFAULT_TTL_S,
                 directory: str | os.PathLike | None = None):
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.keys = sorted(set(keys))
        self.run_id = run_id
        self.ttl_s = float(ttl_s)
        self.directory = Path(directory) if directory is not None else lock_dir()
        self.token = secrets.token_hex(8)
        self.owner = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
        self.lost: str | None = None  # set by the keep-alive when the lease was taken over or cannot be renewed
        self._held: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def _record(self) -> dict:
        return {"owner": self.owner, "hostname": socket.gethostname(), "pid": os.getpid(), "run_id": self.run_id,
                "token": self.token, "expires": time.time() + self.ttl_s,
                "acquired_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def _write(self, key: str, record: dict) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{self.token}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def acquire(self, keepalive: bool = True) -> "BenchLease":
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            for key in self.keys:
                self._take(key)
        except BaseException:
            self.release()
            raise
        if keepalive:
            self._thread = threading.Thread(target=self._keepalive, daemon=True, name="bench-lease")
            self._thread.start()
        return self

    def add(self, key: str) -> None:
        """Take one more key (a switch's identity, learnt once connected) while holding the others; BenchLocked
        if another live run holds it."""
        if key in self._held:
            return
        self._take(key)
        self.keys = sorted(set(self.keys) | {key})

    def _take(self, key: str) -> None:
        """Write our lease on `key` unless another live run holds it (BenchLocked), under the key's flock."""
        with _guard(self.directory, key):
            current = read_lease(self._path(key))
            if lease_is_live(current) and current.get("token") != self.token:
                raise BenchLocked(_held_by(key, current))
            self._write(key, self._record())
            self._held.append(key)

    def renew(self) -> None:
        """Push every expiry ttl_s ahead; sets `lost` if another run took a lease over meanwhile."""
        for key in self._held:
            with _guard(self.directory, key):
                current = read_lease(self._path(key))
                if not current or current.get("token") != self.token:
                    self.lost = f"lease {key} was taken over by {(current or {}).get('owner', 'nobody')}"
                    continue
                current["expires"] = time.time() + self.ttl_s
                current["run_id"] = self.run_id
                self._write(key, current)

    def _keepalive(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except OSError as exc:
                self.lost = f"cannot renew the bench lease: {exc}"

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        for key in self._held:
            try:
                with _guard(self.directory, key):
                    current = read_lease(self._path(key))
                    if current and current.get("token") == self.token:
                        self._path(key).unlink()
            except OSError:
                pass  # it expires on its own
        self._held = []

    def __enter__(self) -> "BenchLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunDirLocked(Exception):
    """Another live process holds the run directory."""


class RunDirLock:
    """One process per run directory: an flock on `RUN_DIR/run.lock`, which also names the holder. The
    kernel drops the flock when the holder dies (SIGKILL included), so a dead run never blocks its resume."""

    NAME = "run.lock"

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self, run_id: str = "") -> "RunDirLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirLocked(f"{self.path.parent} is held by {holder}") from None
        holder = {"owner": f"{getpass.getuser()}@{socket.gethostname()}", "pid": os.getpid(), "run_id": run_id,
                  "since_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file keeps the last holder's name
            self._fd = None
