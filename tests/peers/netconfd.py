"""yuma123 `netconfd` behind a private OpenSSH `sshd`, on loopback, for tests: an independent NETCONF server
loaded with Polatis' own optical-switch YANG (../shared/peers/polatis/).

Everything lives in one temporary directory: sshd's config, host key, the client's key and its
authorized_keys, the known_hosts the driver checks, and the UNIX socket through which sshd's
`netconf-subsystem` reaches `netconfd` (`--ncxserver-sockname`, given to both sides: the subsystem picks
the socket by the port the SSH connection came in on, `PORT@PATH`), so runs in parallel never share
/tmp/ncxserver.sock.
"""
from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NETCONFD = "/usr/sbin/netconfd"
SUBSYSTEM = "/usr/sbin/netconf-subsystem"
SSHD = "/usr/sbin/sshd"
# shared/ lies beside the repository (CI's copy, a checkout's ../shared); OCS_HIL_SHARED names it elsewhere
SHARED = Path(os.environ.get("OCS_HIL_SHARED") or Path(__file__).resolve().parents[2].parent / "shared")
YANG = SHARED / "peers" / "polatis" / "optical-switch@2018-03-22.yang"
# yuma123 2.13 rejects decimal64 ranges with `error(243): invalid real number` (libyang accepts them): the
# two `range` lines of typedef floatFormat2d are dropped in the test's copy only.
_DECIMAL64_RANGE = re.compile(r"^\s*range\s+-?[0-9]+\.[0-9]+\s*\.\.\s*-?[0-9]+\.[0-9]+\s*;\s*$", re.M)


def missing() -> str | None:
    """Why this peer cannot run here, or None."""
    for path, package in ((NETCONFD, "netconfd"), (SUBSYSTEM, "netconfd"), (SSHD, "openssh-server")):
        if not os.access(path, os.X_OK):
            return f"{path} not installed (apt-get install {package})"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not installed (apt-get install openssh-client)"
    if not YANG.is_file():
        return f"Polatis YANG not found at {YANG}"
    if os.geteuid() != 0:
        return "sshd with its own config runs as root here (privilege separation)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def yuma_copy(text: str) -> str:
    """The YANG text as yuma123 can load it: floatFormat2d's decimal64 ranges removed (exactly two)."""
    copy, count = _DECIMAL64_RANGE.subn("", text)
    if count != 2:
        raise RuntimeError(f"expected the 2 decimal64 range lines of floatFormat2d in {YANG}, found {count}")
    return copy


class NetconfdPeer:
    """`netconfd --module=optical-switch` (target `running`, or None: netconfd's default, `:candidate` only)
    behind `sshd` on 127.0.0.1:`port`. `url` is the driver's URL (host key pinned, key login)."""

    def __init__(self, target: str | None = "running"):
        self.target = target
        self.user = getpass.getuser()
        self._dir: tempfile.TemporaryDirectory | None = None
        self._procs: list[subprocess.Popen] = []
        self.port = 0

    @property
    def dir(self) -> Path:
        return Path(self._dir.name)

    @property
    def url(self) -> str:
        return (f"ssh://127.0.0.1:{self.port}?known_hosts={self.dir / 'known_hosts'}"
                f"&identity_file={self.dir / 'id_ed25519'}")

    def log(self, which: str) -> str:
        path = self.dir / f"{which}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> "NetconfdPeer":
        self._dir = tempfile.TemporaryDirectory(prefix="ocs-hil-netconfd-")
        d = self.dir
        try:
            self._start(d)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, d: Path) -> None:
        os.chmod(d, 0o700)
        module = d / "optical-switch@2018-03-22.yang"
        module.write_text(yuma_copy(YANG.read_text()))
        for name in ("ssh_host_ed25519_key", "id_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
        (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
        self.port = _free_port()
        sock = d / "ncxserver.sock"
        (d / "sshd_config").write_text("\n".join([
            "ListenAddress 127.0.0.1", f"Port {self.port}", f"HostKey {d / 'ssh_host_ed25519_key'}",
            f"PidFile {d / 'sshd.pid'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
            f"AllowUsers {self.user}", "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
            "LogLevel VERBOSE",
            f"Subsystem netconf {SUBSYSTEM} --ncxserver-sockname={self.port}@{sock}", ""]))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        command = [NETCONFD, f"--module={module}", f"--superuser={self.user}", "--no-startup",
                   f"--ncxserver-sockname={sock}", f"--port={self.port}",
                   f"--log={d / 'netconfd.log'}", "--log-level=info"]
        if self.target:
            command.append(f"--target={self.target}")
        self._spawn(command, d / "netconfd.out")
        self._wait(lambda: sock.exists(), "netconfd to open its socket", "netconfd")
        self._spawn([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], d / "sshd.log")
        self._wait(lambda: "Server listening" in self.log("sshd"), f"sshd to listen on 127.0.0.1:{self.port}", "sshd")
        key = (d / "ssh_host_ed25519_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {key[0]} {key[1]}\n")

    def _spawn(self, command: list[str], out: Path) -> None:
        with open(out, "wb") as log:
            self._procs.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, cwd=self.dir,
                                                env=dict(os.environ, HOME=str(self.dir))))  # ~/.yuma: its txid file

    def _wait(self, ready, what: str, log: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tail = (self.log(log) or (self.dir / f"{log}.out").read_text(errors="replace"))[-1500:]
                raise RuntimeError(f"waiting for {what}: {'exited' if dead else 'timed out'}\n{tail}")
            time.sleep(0.02)

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "NetconfdPeer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

