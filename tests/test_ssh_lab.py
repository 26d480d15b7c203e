"""SSH as a lab has it, against a real OpenSSH sshd (Debian's openssh-server) started here on 127.0.0.1 as the
jump host, with the project's emulated SSH hosts behind it: ProxyJump chains with strict host keys on every hop,
ssh_config, ProxyCommand, a pinned key with the agent's, an encrypted key's passphrase from the environment,
`become: sudo` and `tools:`, and turnaround runs through the jump host.

The sshd's own debug log (`-e`, LogLevel DEBUG1) is the oracle that traffic went through it: it names every
direct-tcpip channel it opened and where to."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml

from devices.resources import HostResource, JumpHost
from devices.errors import DeviceError, TransportClosed
from devices.ssh import AuthenticationFailed, HostKeyError, SshTransport, learned_known_hosts
from devices.timing import Deadline
from harness.config import load_inventory
from harness.errors import InputError

SSHD = "/usr/sbin/sshd"
needs_sshd = pytest.mark.skipif(not os.path.exists(SSHD) or os.geteuid() != 0,
                                reason="needs OpenSSH's /usr/sbin/sshd (Debian: apt-get install openssh-server) "
                                       "and root (it logs in as root with a key only)")


def _keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "ocs-hil-test", "-f", str(path)],
                   check=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """A real sshd on 127.0.0.1:port: its host key, one authorized client key for root, forwarding allowed."""

    def __init__(self, folder: Path, *extra_config: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.extra_config = folder, list(extra_config)
        self.host_key = _keygen(folder / "ssh_host_ed25519_key")
        self.client_key = _keygen(folder / "id_jump")
        (folder / "authorized_keys").write_text((folder / "id_jump.pub").read_text())
        self.log = folder / "sshd.log"
        self.port = 0
        self.proc = None

    def start(self) -> "Sshd":
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # Debian's privilege separation directory
        for _ in range(5):
            self.port = _free_port()
            config = self.folder / "sshd_config"
            config.write_text("\n".join([
                f"ListenAddress 127.0.0.1:{self.port}", f"HostKey {self.host_key}",
                f"AuthorizedKeysFile {self.folder / 'authorized_keys'} %h/.ssh/authorized_keys", "PidFile none",
                "UsePAM no",
                "StrictModes no", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "AllowTcpForwarding yes", "LogLevel DEBUG1",
                *self.extra_config, ""]))
            log = open(self.log, "wb")
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
            log.close()
            end = time.monotonic() + 10
            while time.monotonic() < end and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                except OSError:
                    time.sleep(0.02)
            self.stop()  # the port was taken meanwhile: another one
        raise RuntimeError(f"sshd did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def known_hosts(self, path: Path) -> Path:
        """A known_hosts naming this sshd's real key."""
        pub = (self.folder / "ssh_host_ed25519_key.pub").read_text().split()
        path.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        return path

    def forwards(self) -> list[int]:
        """The ports of the direct-tcpip channels it opened, in order (its own debug log)."""
        ports = []
        for line in self.log.read_text(errors="replace").splitlines():
            if "server_request_direct_tcpip" in line and "target" in line:
                ports.append(int(line.rsplit("port", 1)[1].split()[0]))
        return ports


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not os.path.exists(SSHD) or os.geteuid() != 0:
        pytest.skip("needs /usr/sbin/sshd and root")
    daemon = Sshd(tmp_path_factory.mktemp("sshd")).start()
    yield daemon
    daemon.stop()


def _jump(sshd: Sshd, tmp_path: Path, **kw) -> JumpHost:
    return JumpHost(address="127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.client_key),
                    known_hosts=str(sshd.known_hosts(tmp_path / "jump_known_hosts")), **kw)


def _behind(server, *hops: JumpHost, **kw) -> HostResource:
    """The emulated host as a lab's host behind `hops`: strict host keys everywhere."""
    r = server.resource()
    return HostResource(name=r.name, address=r.address, port=r.port, user=r.user, identity_file=r.identity_file,
                        known_hosts=r.known_hosts, strict_host_key=True, proxy_jump=hops, **kw)


@needs_sshd
def test_proxy_jump_through_real_sshd_with_strict_host_keys(sshd, server, tmp_path):
    before = len(sshd.forwards())
    with SshTransport(_behind(server, _jump(sshd, tmp_path)), retries=0) as t:
        result = t.run("hostname", check=True)
        assert result.stdout.strip() == server.host_name
        stamps = t.receive_stamps()  # the jump host's TCP socket dates the replies
    assert sshd.forwards()[before:] == [server.port]  # the sshd opened the channel to the host, once
    assert stamps["stamp"] == "kernel"


@needs_sshd
def test_a_dropped_host_is_reached_again_through_the_jump_host(sshd, server, tmp_path):
    before = len(sshd.forwards())
    with SshTransport(_behind(server, _jump(sshd, tmp_path)), retries=1, backoff_s=0.05) as t:
        assert t.run("hostname", check=True).stdout.strip() == server.host_name
        assert server.drop_connections() >= 1
        deadline = time.monotonic() + 5
        while t._client.get_transport().is_active() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.run("hostname", check=True).stdout.strip() == server.host_name
        assert t.connects == 2
    assert sshd.forwards()[before:] == [server.port, server.port]


@needs_sshd
def test_output_that_comes_with_the_close_is_kept(sshd, tmp_path, monkeypatch):
    """OpenSSH sends a short command's output, exit status, EOF and close together: a read that timed out just
    before they came must still collect the output (3 of 400 `echo` runs came back empty, exit 0, before the
    fix). Each timed-out read here returns only once the close has come, so the race is taken every time."""
    recv = paramiko.Channel.recv

    def late_timeout(channel, n):
        try:
            return recv(channel, n)
        except socket.timeout:
            channel.status_event.wait(5)  # the output and the exit status came meanwhile
            end = time.monotonic() + 5
            while not channel.closed and time.monotonic() < end:
                time.sleep(0.005)
            raise

    monkeypatch.setattr(paramiko.Channel, "recv", late_timeout)
    root = HostResource("real", "127.0.0.1", sshd.port, "root", str(sshd.client_key),
                        str(sshd.known_hosts(tmp_path / "kh")))
    with SshTransport(root, retries=0) as t:
        assert [t.run("sleep 0.2; echo x", check=True).stdout for _ in range(3)] == ["x\n"] * 3


@needs_sshd
def test_key_re_exchanges_asked_by_both_ends_while_commands_run_against_real_sshd(tmp_path):
    """A real sshd that asks for new keys every 2 KiB (RekeyLimit) and a client that asks every 2 KiB too (~27
    exchanges), while three threads run commands whose channels OpenSSH closes as exchanges start: every command
    runs, on one connection, and the sshd's own log counts the exchanges. (The close that crosses our request
    for new keys is rare here, a loopback round trip wide: test_sshhub.py takes it every time.)"""
    daemon = Sshd(tmp_path / "sshd", "RekeyLimit 2K").start()
    try:
        root = HostResource("real", "127.0.0.1", daemon.port, "root", str(daemon.client_key),
                            str(daemon.known_hosts(tmp_path / "kh")))
        with SshTransport(root, retries=0) as t:
            t.run("true", check=True)
            t._client.get_transport().packetizer.REKEY_BYTES = 2048  # paramiko's limit, 512 MiB, made small
            results: list[str] = []

            def commands(k: int) -> None:
                results.extend(t.run(f"echo {k}-{i}", check=True).stdout for i in range(30))

            workers = [threading.Thread(target=commands, args=(k,)) for k in range(3)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(120)
            assert sorted(results) == sorted(f"{k}-{i}\n" for k in range(3) for i in range(30))
            assert t.connects == 1
    finally:
        daemon.stop()
    log = daemon.log.read_text(errors="replace")
    assert log.count("SSH2_MSG_KEXINIT sent") >= 10, log[-3000:]


def _real_or_emulated(host: str, request, tmp_path: Path) -> HostResource:
    """Root on the module's real sshd, or the emulated host: one test holds both to the same behaviour."""
    if host == "real sshd":
        daemon = request.getfixturevalue("sshd")
        return HostResource("real", "127.0.0.1", daemon.port, "root", str(daemon.client_key),
                            str(daemon.known_hosts(tmp_path / "kh")))
    return request.getfixturevalue("server").resource()


@pytest.mark.parametrize("host", ["real sshd", "emulated host"])
def test_cat_copies_stdin_as_it_comes(host, request, tmp_path):
    """`cat` reading a session's stdin writes each piece before the next comes, on the real host and the emulated
    one alike (the emulated one held it all until stdin ended)."""
    resource = _real_or_emulated(host, request, tmp_path)
    with SshTransport(resource, retries=0) as t:
        stream = t.stream("cat")
        for i in range(3):
            stream.write(f"piece {i}\n")
            assert stream.readline(Deadline(20))[1] == f"piece {i}"
        stream.close()


@pytest.mark.parametrize("host", ["real sshd", "emulated host"])
def test_an_eleventh_session_at_once_goes_on_another_connection(host, request, tmp_path):
    """OpenSSH's MaxSessions, 10 by default: ten sessions open at once on one connection, the eleventh refused
    (channel open failure 2; "no more sessions" in sshd's log). The emulated host refuses it as the real sshd does,
    so the emulated bench holds the harness to it; the harness opens the session on a second connection to the
    host, and the next refused one there too, not on a third."""
    resource = _real_or_emulated(host, request, tmp_path)
    with SshTransport(resource, retries=0) as t:
        streams = [t.stream("cat") for _ in range(10)]  # each ends as its channel closes (its stdin ends)
        assert t.overflow_connects == 0
        assert t.run("echo eleventh", check=True).stdout == "eleventh\n"
        streams.append(t.stream("cat"))
        assert t.run("echo twelfth", check=True).stdout == "twelfth\n"
        assert (t.connects, t.overflow_connects) == (1, 1)
        for stream in streams:
            stream.close()
    if host == "real sshd":
        assert "no more sessions" in request.getfixturevalue("sshd").log.read_text(errors="replace")


@needs_sshd
def test_hosts_behind_one_bastion_log_in_at_once_without_passing_its_max_startups(tmp_path):
    """24 hosts behind one real bastion whose sshd drops every connection past 10 not yet logged in (`MaxStartups
    10:100:10`, the default's 10 made hard), all connected at once, none retried: at most 8 of a process's logins
    are under way at one jump host, so none is dropped (9 of 32 were, on the default 10:30:100, before)."""
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile, profile_from_dict
    from devices.emulated.host.server import EmulatedHostServer

    data = yaml.safe_load(Path(load_profile("instant").path).read_text())
    data["topology"] = {"hosts": 24, "nics_per_host": 1, "ocs_size": [24, 24]}
    bench = OpticalBench(profile_from_dict(data), seed=1)
    servers = [EmulatedHostServer(bench, name).start() for name in bench.hosts]
    daemon = Sshd(tmp_path / "bastion", "MaxStartups 10:100:10").start()
    try:
        hop = _jump(daemon, tmp_path)
        transports = [SshTransport(_behind(s, hop), retries=0) for s in servers]
        failed: list[str] = []

        def connect(t: SshTransport) -> None:
            try:
                t.connect()
            except TransportClosed as exc:
                failed.append(str(exc))

        threads = [threading.Thread(target=connect, args=(t,)) for t in transports]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert failed == []
        assert [t.run("hostname", check=True).stdout.strip() for t in transports] == [s.host_name for s in servers]
        for t in transports:
            t.close()
    finally:
        daemon.stop()
        for s in servers:
            s.stop()
        bench.stop()
    assert "drop connection" not in daemon.log.read_text(errors="replace")


@needs_sshd
def test_installs_at_once_into_one_home_always_leave_a_whole_agent(sshd, tmp_path):
    """Four connections to one real sshd share its home, as hosts on an NFS home do: each installs the agent and
    checks it 12 times, all at once. Every check runs a whole agent, which names this machine's python3 (written in
    place, 1 of 160 such installs ran an empty one)."""
    from devices.hostagent import HostAgent

    root = HostResource("real", "127.0.0.1", sshd.port, "root", str(sshd.client_key),
                        str(sshd.known_hosts(tmp_path / "kh")))
    versions: list[str | None] = []

    def installs() -> None:
        with SshTransport(root, retries=0) as t:
            for _ in range(12):
                agent = HostAgent(t)
                try:
                    agent.install()
                except DeviceError as exc:
                    versions.append(str(exc))
                else:
                    versions.append(agent.python_version)

    threads = [threading.Thread(target=installs) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    with SshTransport(root, retries=0) as t:  # the python3 the sshd's sessions find
        here = t.run("python3 --version", check=True).stdout.split()[1]
    assert versions == [here] * 48


@needs_sshd
def test_two_hop_chain(sshd, server, tmp_path):
    before = len(sshd.forwards())
    hop = _jump(sshd, tmp_path)
    with SshTransport(_behind(server, hop, hop), retries=0) as t:
        assert t.run("hostname", check=True).stdout.strip() == server.host_name
    # the first hop forwarded to the second (itself again), the second to the host
    assert sshd.forwards()[before:] == [sshd.port, server.port]


@needs_sshd
def test_wrong_or_unknown_jump_host_key_is_refused(sshd, server, tmp_path):
    other = paramiko.Ed25519Key.from_private_key_file(str(_keygen(tmp_path / "other")))
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other.get_name()} {other.get_base64()}\n")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    before = len(sshd.forwards())
    for known_hosts, what in ((wrong, "does not match"), (empty, "not in known_hosts")):
        hop = JumpHost("127.0.0.1", sshd.port, "root", str(sshd.client_key), str(known_hosts))
        with SshTransport(_behind(server, hop), retries=2) as t:
            with pytest.raises(HostKeyError) as caught:
                t.run("hostname")
        message = str(caught.value)
        assert f"jump host root@127.0.0.1:{sshd.port}" in message and what in message and "refused" in message
        assert t.connects == 0
    assert sshd.forwards()[before:] == []  # nothing was forwarded
    assert empty.read_text() == ""


@needs_sshd
def test_wrong_key_of_the_host_behind_the_jump_is_refused(sshd, server, tmp_path):
    other = paramiko.Ed25519Key.from_private_key_file(str(_keygen(tmp_path / "other")))
    wrong = tmp_path / "host_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{server.port} {other.get_name()} {other.get_base64()}\n")
    resource = _behind(server, _jump(sshd, tmp_path))
    resource = HostResource(**{**resource.__dict__, "known_hosts": str(wrong)})
    with SshTransport(resource, retries=0) as t, pytest.raises(HostKeyError) as caught:
        t.run("hostname")
    assert "jump host" not in str(caught.value) and "does not match" in str(caught.value)


@needs_sshd
def test_emulated_bench_learns_unknown_keys_privately(sshd, server, tmp_path):
    """Relaxed checks (emulated bench) still refuse nothing known, and write what they learn to the process's
    own known_hosts, never to the inventory's file."""
    inventory_known = tmp_path / "known_hosts"
    inventory_known.write_text("")
    r = server.resource()
    relaxed = HostResource(name=r.name, address=r.address, port=r.port, user=r.user, identity_file=r.identity_file,
                           known_hosts=str(inventory_known), strict_host_key=False)
    with SshTransport(relaxed, retries=0) as t:
        assert t.run("hostname", check=True).stdout.strip() == server.host_name
    assert inventory_known.read_text() == ""
    learned = Path(learned_known_hosts()).read_text()
    assert f"[127.0.0.1]:{server.port} ssh-ed25519 {server.host_key.get_base64()}" in learned


@needs_sshd
def test_encrypted_key_with_passphrase_from_environment(sshd, server, tmp_path, monkeypatch):
    key = tmp_path / "id_encrypted"
    shutil.copy(server.client_key_path, key)
    secret = "correct horse battery staple"
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", secret, "-f", str(key)], check=True)
    pub = server.client_key_path.with_suffix(".pub").read_text()
    kh = sshd.known_hosts(tmp_path / "jump_known_hosts")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
                      f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {kh}\n")
    inventory = tmp_path / "inventory.yaml"

    def write(**host):
        inventory.write_text(yaml.safe_dump({
            "bench": {"name": "lab"},
            "ocs": {"ocs1": {"protocol": "polatis-tl1", "url": "tcp://127.0.0.1:1", "size": [4, 4],
                             "allowed_ports": ["1-8"]}},
            "hosts": {"gpu1": {"address": "127.0.0.1", "port": server.port, "user": server.user,
                               "identity_file": str(key), "known_hosts": str(server.known_hosts_path),
                               "ssh_config": str(config), "proxy_jump": "bastion", **host}}}))
        return load_inventory(inventory).hosts["gpu1"]

    with SshTransport(write(), retries=0) as t, pytest.raises(AuthenticationFailed) as caught:
        t.run("hostname")
    assert "is encrypted" in str(caught.value) and "passphrase_env" in str(caught.value)
    monkeypatch.delenv("LAB_KEY_PASSPHRASE", raising=False)
    with pytest.raises(InputError, match="LAB_KEY_PASSPHRASE is not set"):
        write(passphrase_env="LAB_KEY_PASSPHRASE")
    monkeypatch.setenv("LAB_KEY_PASSPHRASE", "wrong")
    with SshTransport(write(passphrase_env="LAB_KEY_PASSPHRASE"), retries=0) as t, \
            pytest.raises(AuthenticationFailed, match="wrong passphrase"):
        t.run("hostname")
    monkeypatch.setenv("LAB_KEY_PASSPHRASE", secret)
    resource = write(passphrase_env="LAB_KEY_PASSPHRASE")
    assert secret not in repr(resource) and secret not in inventory.read_text()
    with SshTransport(resource, retries=0) as t:
        assert t.run("hostname", check=True).stdout.strip() == server.host_name
    assert pub  # the key itself is the emulated host's own, only encrypted


@needs_sshd
def test_ssh_config_resolves_host_and_jump_and_inventory_wins(sshd, server, tmp_path):
    kh = sshd.known_hosts(tmp_path / "jump_known_hosts")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile {sshd.client_key}\n"
        f"  UserKnownHostsFile {kh}\n\n"
        f"Host gpu*\n  HostName 127.0.0.1\n  Port {server.port}\n  User nobody\n"
        f"  IdentityFile {server.client_key_path}\n  UserKnownHostsFile {server.known_hosts_path}\n"
        f"  ProxyJump bastion\n\n"
        f"Host piped\n  HostName 10.0.0.7\n  Port 2222\n  ProxyCommand ssh -W %h:%p bastion\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "bench": {"name": "lab"},
        "ocs": {"ocs1": {"protocol": "polatis-tl1", "url": "tcp://127.0.0.1:1", "size": [4, 4],
                         "allowed_ports": ["1-8"]}},
        "host_defaults": {"ssh_config": str(config)},
        "hosts": {"gpu1": {"user": server.user}, "gpu2": {"address": "gpu-other", "proxy_jump": "none"},
                  "gpu3": {"address": "piped"}}}))
    hosts = load_inventory(inventory).hosts
    gpu1 = hosts["gpu1"]
    assert (gpu1.address, gpu1.port, gpu1.user) == ("127.0.0.1", server.port, server.user)  # User: inventory's
    assert gpu1.identity_file == str(server.client_key_path) and gpu1.known_hosts == str(server.known_hosts_path)
    assert gpu1.proxy_jump == (JumpHost("127.0.0.1", sshd.port, "root", str(sshd.client_key), str(kh)),)
    assert hosts["gpu2"].proxy_jump == () and hosts["gpu2"].user == "nobody"  # `none` beats ssh_config's
    assert hosts["gpu3"].proxy_command == "ssh -W 10.0.0.7:2222 bastion" and hosts["gpu3"].proxy_jump == ()
    assert (hosts["gpu3"].address, hosts["gpu3"].port, hosts["gpu3"].user) == ("10.0.0.7", 2222, "root")
    before = len(sshd.forwards())
    with SshTransport(gpu1, retries=0) as t:
        assert t.run("hostname", check=True).stdout.strip() == server.host_name
    assert sshd.forwards()[before:] == [server.port]


def test_ssh_config_and_jump_errors_name_file_and_line(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    base = {"bench": {"name": "lab"},
            "ocs": {"ocs1": {"protocol": "polatis-tl1", "url": "tcp://127.0.0.1:1", "size": [4, 4],
                             "allowed_ports": ["1-8"]}}}
    cases = [({"a": {"address": "x", "ssh_config": str(tmp_path / "missing")}}, "ssh_config"),
             ({"a": {"address": "x", "ssh_config": "none", "proxy_jump": "bad host"}}, "proxy_jump"),
             ({"a": {"address": "x", "ssh_config": "none", "proxy_jump": ["j"], "proxy_command": "nc %h %p"}},
              "exclude each other"),
             ({"a": {"address": "x", "ssh_config": "none", "tools": {"ethtool": "ethtool"}}}, "absolute path"),
             ({"a": {"address": "x", "ssh_config": "none", "tools": {"ethtol": "/usr/sbin/ethtool"}}}, "ethtol"),
             ({"a": {"address": "x", "ssh_config": "none", "become": "su"}}, "become")]
    for hosts, needle in cases:
        inventory.write_text(yaml.safe_dump({**base, "hosts": hosts}))
        with pytest.raises(InputError) as caught:
            load_inventory(inventory)
        text = caught.value.format()
        assert needle in text and f"{inventory}:" in text, text


@needs_sshd
def test_proxy_command_through_real_ssh_client(sshd, server, tmp_path):
    """OpenSSH's own client as the ProxyCommand (`ssh -W %h:%p`), strict on the jump host too."""
    if shutil.which("ssh") is None:
        pytest.skip("needs the OpenSSH client (ssh)")
    kh = sshd.known_hosts(tmp_path / "jump_known_hosts")
    r = server.resource()
    command = (f"ssh -q -i {sshd.client_key} -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
               f"-o UserKnownHostsFile={kh} -o BatchMode=yes -p {sshd.port} -W {r.address}:{r.port} root@127.0.0.1")
    resource = HostResource(name=r.name, address=r.address, port=r.port, user=r.user, identity_file=r.identity_file,
                            known_hosts=r.known_hosts, strict_host_key=True, proxy_command=command)
    before = len(sshd.forwards())
    with SshTransport(resource, retries=0) as t:
        for _ in range(3):
            assert t.run("hostname", check=True).stdout.strip() == server.host_name
        assert t.receive_stamps()["stamp"] == "read"  # a pipe: dated by its read, and says so
    assert sshd.forwards()[before:] == [server.port]


@needs_sshd
def test_agent_key_for_the_jump_pinned_key_for_the_host(sshd, server, tmp_path, monkeypatch):
    """The jump host accepts only the agent's key, the host only the pinned file: both are used."""
    if shutil.which("ssh-agent") is None:
        pytest.skip("needs ssh-agent")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        # the socket file appears at bind, before the agent listens: ready once `ssh-add -l` reaches it (exit 2:
        # no connection; 1: an agent without keys)
        end = time.monotonic() + 10
        while subprocess.run(["ssh-add", "-l"], env=env, capture_output=True).returncode == 2:
            assert time.monotonic() < end, "ssh-agent did not listen within 10 s"
            time.sleep(0.01)
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True, stderr=subprocess.DEVNULL)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        hop = JumpHost("127.0.0.1", sshd.port, "root", None, str(sshd.known_hosts(tmp_path / "kh")))
        with SshTransport(_behind(server, hop), retries=0) as t:
            assert t.run("hostname", check=True).stdout.strip() == server.host_name
        monkeypatch.delenv("SSH_AUTH_SOCK")  # without the agent the jump host refuses
        with SshTransport(_behind(server, hop), retries=0) as t, pytest.raises(AuthenticationFailed, match="jump"):
            t.run("hostname")
    finally:
        agent.terminate()
        agent.wait(5)


# ------------------------------------------------------------------ turnaround runs through the jump host
@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    from devices.emulated.bench import EmulatedBench

    with EmulatedBench("instant", seed=3, workdir=tmp_path_factory.mktemp("bench")) as bench:
        yield bench


def _lab_inventory(emulated, path: Path, **host_defaults) -> Path:
    """The emulated bench as a real lab's inventory: not marked emulated (strict host keys on every hop)."""
    inventory = emulated.inventory()
    inventory["bench"] = {"name": "lab-behind-bastion", "emulated": False}
    inventory["host_defaults"] = host_defaults
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def _run(tmp_path: Path, inventory: Path, name: str, capsys, **step) -> tuple[int, Path, str]:
    from harness.cli import main

    playbook = tmp_path / f"{name}.yaml"
    playbook.write_text(yaml.safe_dump({"name": name, "bench": "emulated:instant", "seed": 3, "cycles": 2, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3, **step}]}))
    out = tmp_path / f"run-{name}"
    code = main(["run", str(playbook), "--bench", str(inventory), "--out", str(out), "-q"])
    return code, out if out.exists() else None, capsys.readouterr().err


def _bastion_config(sshd: Sshd, tmp_path: Path) -> Path:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n"
                      f"  IdentityFile {sshd.client_key}\n"
                      f"  UserKnownHostsFile {sshd.known_hosts(tmp_path / 'bastion_known_hosts')}\n")
    return config


@needs_sshd
def test_turnaround_through_real_openssh_jump_host_with_strict_host_keys(sshd, emulated, tmp_path, capsys):
    inventory = _lab_inventory(emulated, tmp_path / "lab.yaml", ssh_config=str(_bastion_config(sshd, tmp_path)),
                               proxy_jump="bastion")
    hosts = load_inventory(inventory).hosts
    assert all(h.strict_host_key and [str(j) for j in h.proxy_jump] == [f"root@127.0.0.1:{sshd.port}"]
               for h in hosts.values())
    before = len(sshd.forwards())
    code, run, err = _run(tmp_path, inventory, "jump", capsys)
    assert code == 0, err
    events = __import__("pandas").read_parquet(run / "events.parquet")
    assert {"light_detected", "phy_up", "port_active"} <= set(events["stage"])
    forwarded = set(sshd.forwards()[before:])
    assert forwarded == {s.port for s in emulated.host_servers.values()}  # every host's SSH went through it
    assert "unobserved" not in json_manifest(run)


def json_manifest(run: Path) -> str:
    return (run / "manifest.json").read_text()


def test_turnaround_as_non_root_with_become_sudo(emulated, tmp_path, capsys):
    """User `lab` (not root) with `become: sudo` and ethtool at its declared path: the agent and `ethtool -m` run
    under `sudo -n` on every host (the emulated host's sudo records it), every stage observed."""
    servers = emulated.host_servers.values()
    for server in servers:
        server.sudo_commands.clear()
    inventory = _lab_inventory(emulated, tmp_path / "lab.yaml", ssh_config="none", become="sudo",
                               tools={"ethtool": "/usr/sbin/ethtool"})
    assert {h.user for h in load_inventory(inventory).hosts.values()} == {"lab"}
    code, run, err = _run(tmp_path, inventory, "sudo", capsys)
    assert code == 0, err
    for server in servers:
        ran = server.sudo_commands
        assert any(c.startswith("/usr/sbin/ethtool -m ") for c in ran), ran  # the preflight's
        assert any(" watch " in c and "--ethtool /usr/sbin/ethtool" in c for c in ran), ran  # the agent's
        assert any(c.endswith(" timesrv") for c in ran), ran
    events = __import__("pandas").read_parquet(run / "events.parquet")
    assert {"light_detected", "cdr_locked", "phy_up", "port_active"} <= set(events["stage"])


def test_lost_stages_stop_the_run_with_one_line_per_host(emulated, tmp_path, capsys):
    """sudo refused, or ethtool not at its declared path: the preflight names the host, the stages and why, and
    the run stops before any switch is touched; with ethtool_interval_us: 0 the same bench runs and says so."""
    server = next(iter(emulated.host_servers.values()))
    patches = emulated.physics.ocs_patches()
    inventory = _lab_inventory(emulated, tmp_path / "lab.yaml", ssh_config="none", become="sudo")
    server.sudo_allowed = False
    try:
        code, run, err = _run(tmp_path, inventory, "refused", capsys)
    finally:
        server.sudo_allowed = True
    assert code != 0 and f"host {server.host_name} (lab@127.0.0.1 via sudo -n): observes nothing" in err
    assert "sudo -n refused (sudo: a password is required)" in err
    assert emulated.physics.ocs_patches() == patches
    inventory = _lab_inventory(emulated, tmp_path / "lab.yaml", ssh_config="none",
                               tools={"ethtool": "/opt/nowhere/ethtool"})
    code, run, err = _run(tmp_path, inventory, "missing", capsys)
    assert code != 0, err
    lines = [line for line in err.splitlines() if line.startswith("preflight: host ")]
    assert len(lines) == len(emulated.host_servers), err
    assert all("not light_detected, cdr_locked, light_lost: /opt/nowhere/ethtool not found" in l for l in lines)
    assert "tools:" in err and "become: sudo" in err  # what to fix
    assert emulated.physics.ocs_patches() == patches


def test_a_module_without_flags_is_said_on_console_and_in_summary(emulated, tmp_path, capsys):
    """ethtool < 6.4 prints no Rx loss of signal/lock: nothing the lab can fix, so the run goes on, and says so."""
    from devices.emulated import formats

    servers = list(emulated.host_servers.values())
    saved = [s.tools for s in servers]
    for server in servers:
        server.tools = formats.ToolVersions(ethtool="6.1")
    try:
        inventory = _lab_inventory(emulated, tmp_path / "lab.yaml", ssh_config="none")
        code, run, err = _run(tmp_path, inventory, "old-ethtool", capsys)
    finally:
        for server, tools in zip(servers, saved):
            server.tools = tools
    assert code == 0, err
    why = ("not light_detected, light_lost: `ethtool -m` shows no Rx loss of signal (ethtool < 6.4); "
           "not cdr_locked: `ethtool -m` shows no Rx loss of lock")
    assert sum(why in line for line in err.splitlines()) == len(servers), err
    summary = (run / "summary.md").read_text()
    assert sum(why in line and "stages not observed" in line for line in summary.splitlines()) == len(servers)


def test_the_real_agent_runs_the_declared_ethtool_and_names_it_when_missing(tmp_path):
    """hilagent's watch calls the ethtool it is given (the inventory's tools:), and says which one it lacks."""
    import sys

    from devices.agent import AGENT_FILE

    fake = tmp_path / "ethtool"  # prints one SFF-8636 excerpt's flags, as ethtool 6.4+ does
    fake.write_text("#!/bin/sh\nprintf '\\tRx loss of signal                         : [ Yes, No, No, No ]\\n"
                    "\\tRx loss of lock                           : None\\n'\n")
    fake.chmod(0o755)
    for ethtool, stream, wanted in ((str(fake), "stdout", {"lo rx_los 1", "lo rx_lol 0"}),
                                    (str(tmp_path / "missing"), "stderr",
                                     {f"{tmp_path / 'missing'} not found; rx_los and rx_lol not watched"})):
        proc = subprocess.Popen([sys.executable, "-u", str(AGENT_FILE), "watch", "--interval-us", "2000",
                                 "--ethtool-interval-us", "2000", "--ethtool", ethtool, "lo"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(60, proc.kill)  # a watch that never prints them ends the wait, not the suite
        watchdog.start()
        seen = []
        try:  # read until every wanted line arrived (however slow the machine), then stdin's EOF ends the watch
            for line in getattr(proc, stream):
                seen.append(line)
                if stream == "stdout":
                    wanted.discard(" ".join(line.split()[1:4]))
                else:
                    wanted = {w for w in wanted if w not in line}
                if not wanted:
                    break
        finally:
            watchdog.cancel()
            proc.communicate(input="", timeout=20)
        assert not wanted, (wanted, seen)


def test_commands_as_the_host_runs_them():
    plain = HostResource("h", "192.0.2.1")
    assert plain.as_run("ethtool -m eth0") == "ethtool -m eth0"  # nothing declared: as written
    lab = HostResource("h", "192.0.2.1", user="lab", become="sudo",
                       tools=(("ethtool", "/usr/sbin/ethtool"), ("ip", "/usr/sbin/ip")))
    assert lab.as_run("ethtool -m eth0") == "sudo -n /usr/sbin/ethtool -m eth0"
    assert lab.as_run("ip link set dev eth0 down") == "sudo -n /usr/sbin/ip link set dev eth0 down"
    assert lab.as_run("ip -j link") == "/usr/sbin/ip -j link"  # reading needs no root
    assert lab.as_run("python3 -u .cache/ocs-hil/hilagent-x.py watch") == \
        "sudo -n python3 -u .cache/ocs-hil/hilagent-x.py watch"  # the agent
    assert lab.as_run("nvidia-smi -L") == "nvidia-smi -L" and lab.as_run("sudo -n true") == "sudo -n true"
    assert lab.as_run("mkdir -p d && cat > d/f") == "mkdir -p d && cat > d/f"


# ------------------------------------------------------------------ real sudo, on the real sshd as the host
@pytest.fixture
def lab_user(sshd, tmp_path):
    """A non-root login on the real sshd, created for this test and removed after it (with its sudoers file)."""
    if shutil.which("sudo") is None or shutil.which("useradd") is None:
        pytest.skip("needs sudo and useradd (Debian: apt-get install sudo)")
    import tempfile

    name = f"ocshil{os.getpid()}"
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))  # outside pytest's root-only folder: sshd reads it as the user
    sudoers = Path(f"/etc/sudoers.d/{name}")
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-p", "*", name], check=True)
    try:
        key = _keygen(tmp_path / "id_lab")
        (home / ".ssh").mkdir()
        (home / ".ssh" / "authorized_keys").write_text((tmp_path / "id_lab.pub").read_text())
        for path in (home, home / ".ssh", home / ".ssh" / "authorized_keys"):
            shutil.chown(path, name)
        yield name, key, sudoers
    finally:
        sudoers.unlink(missing_ok=True)
        end = time.monotonic() + 5  # its sshd session may outlive the test's connection by a moment
        while subprocess.run(["userdel", name], capture_output=True).returncode == 8 and time.monotonic() < end:
            time.sleep(0.1)  # 8: the user is logged in
        subprocess.run(["userdel", "-f", name], capture_output=True)  # nothing left to do once removed
        shutil.rmtree(home, ignore_errors=True)


@needs_sshd
def test_become_sudo_with_real_sudo(sshd, lab_user, tmp_path):
    """`become: sudo` runs the agent's interpreter under real `sudo -n`: as root where sudoers allows it without
    a password, refused with sudo's own words (which the emulated host repeats) where it does not."""
    from devices.hostagent import HostAgent
    from devices.timing import Deadline

    name, key, sudoers = lab_user
    kh = str(sshd.known_hosts(tmp_path / "kh"))
    whoami = "python3 -c 'import os; print(os.geteuid())'"
    plain = HostResource("real", "127.0.0.1", sshd.port, name, str(key), kh)
    become = HostResource("real", "127.0.0.1", sshd.port, name, str(key), kh, become="sudo")
    with SshTransport(plain, retries=0) as t:
        assert t.run(whoami, check=True).stdout.strip() == str(int(subprocess.check_output(["id", "-u", name])))
    with SshTransport(become, retries=0) as t:
        refused = t.run(whoami)
        assert refused.exit_status == 1 and refused.stderr.strip().splitlines()[-1] == "sudo: a password is required"
        sudoers.write_text(f"{name} ALL=(root) NOPASSWD: ALL\n")
        sudoers.chmod(0o440)
        assert t.run(whoami, check=True).stdout.strip() == "0"
        agent = HostAgent(t)  # installed as the user, run as root from the login directory
        agent.install(Deadline(20))
        with agent.timesrv() as stream:
            stream.write("t1\n")
            got = stream.readline(Deadline(20))
        assert got is not None and got[1].split()[0] == "t1"
    from devices.emulated.host.shell import _sudo  # the emulated host says what real sudo says
    import inspect
    assert '"sudo: a password is required\\n"' in inspect.getsource(_sudo)
