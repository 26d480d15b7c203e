"""The NETCONF driver through a lab's SSH jump host: yuma123 `netconfd` (tests/peers/netconfd.py) reached only
through a real OpenSSH sshd used as a bastion (tests/test_ssh_lab.py's `Sshd`), strict host keys on every hop,
and the switch's key encrypted with its passphrase from the environment. The inventory is read as a lab writes it
(`ocs.*.proxy_jump`, `passphrase_env`). Oracles: the bastion's own debug log names the direct-tcpip channel it
opened to the switch, and a second, plain ncclient session reads what netconfd holds."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from harness.config import load_inventory
from harness.errors import InputError
from tests.peers.netconfd import NetconfdPeer, missing
from tests.test_ssh_lab import Sshd

WHY_NOT = missing()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"netconfd peer or sshd unavailable: {WHY_NOT}")

from devices.errors import DeviceError  # noqa: E402
from devices.ocs import open_switch  # noqa: E402
from devices.ssh import AuthenticationFailed  # noqa: E402
from tests.test_netconf_peer import _truth  # noqa: E402

SECRET = "correct horse battery staple"


@pytest.fixture(scope="module")
def peer():
    with NetconfdPeer() as p:
        yield p


@pytest.fixture(scope="module")
def bastion(tmp_path_factory, peer):
    daemon = Sshd(tmp_path_factory.mktemp("bastion"))
    # the lab's one key logs into the bastion and the switch alike (the hop takes the URL's identity_file)
    (daemon.folder / "authorized_keys").write_text((peer.dir / "id_ed25519.pub").read_text())
    daemon.start()
    yield daemon
    daemon.stop()


def _known_hosts(path, peer, bastion, bastion_key=None):
    """One known_hosts for both hops, as a lab keeps it: the switch's key and the bastion's (or another key)."""
    bastion.known_hosts(path)
    line = path.read_text()
    if bastion_key is not None:
        line = f"[127.0.0.1]:{bastion.port} {bastion_key}\n"
    path.write_text(line + (peer.dir / "known_hosts").read_text())
    return path


def _inventory(tmp_path, peer, bastion, *, key=None, known_hosts=None, **ocs):
    key = key or peer.dir / "id_ed25519"
    known_hosts = known_hosts or _known_hosts(tmp_path / "known_hosts", peer, bastion)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"bench": {"name": "lab"}, "hosts": {}, "ocs": {"sw": {
        "protocol": "polatis-netconf", "size": [16, 16], "allowed_ports": ["1-32"], "user": peer.user,
        "url": f"ssh://127.0.0.1:{peer.port}?known_hosts={known_hosts}&identity_file={key}",
        "proxy_jump": f"root@127.0.0.1:{bastion.port}", **ocs}}}))
    return load_inventory(path).ocs["sw"]


def _encrypted_key(tmp_path, peer):
    key = tmp_path / "id_encrypted"
    shutil.copy(peer.dir / "id_ed25519", key)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", SECRET, "-f", str(key)], check=True)
    return key


def test_the_switch_is_read_and_changed_through_the_bastion(peer, bastion, tmp_path):
    truth = _truth(peer)
    try:
        truth.clear()
        truth.edit("<pair><ingress>3</ingress><egress>19</egress></pair>")
        before = len(bastion.forwards())
        switch = open_switch(_inventory(tmp_path, peer, bastion), timeout_s=10)
        try:
            assert switch.patches() == {3: 19}
            timing = switch.connect(5, 21)
            assert truth.pairs() == {3: 19, 5: 21}
            assert "jump host" in timing.completed_stamp  # read times, and said so
            assert bastion.forwards()[before:] == [peer.port]  # one direct-tcpip channel, to the switch
            switch.reconnect()  # a fresh route: the old one closed, a new channel opened
            assert switch.patches() == {3: 19, 5: 21}
        finally:
            switch.close()
        assert bastion.forwards()[before:] == [peer.port, peer.port]
        assert switch._jump is None  # the route went with the session
    finally:
        truth.clear()
        truth.close()


def test_a_wrong_bastion_host_key_is_refused(peer, bastion, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    before = len(bastion.forwards())
    resource = _inventory(tmp_path, peer, bastion, known_hosts=_known_hosts(tmp_path / "kh", peer, bastion, wrong))
    with pytest.raises(DeviceError, match="host key does not match"):
        open_switch(resource, timeout_s=10)
    assert bastion.forwards()[before:] == []  # refused before anything was forwarded


def test_an_encrypted_key_logs_in_with_the_passphrase_from_the_environment(peer, bastion, tmp_path, monkeypatch):
    key = _encrypted_key(tmp_path, peer)
    monkeypatch.setenv("SW_KEY_PASSPHRASE", SECRET)
    resource = _inventory(tmp_path, peer, bastion, key=key, passphrase_env="SW_KEY_PASSPHRASE")
    assert SECRET not in repr(resource)
    switch = open_switch(resource, timeout_s=10)  # both hops log in with the decrypted key
    try:
        assert isinstance(switch.patches(), dict)
    finally:
        switch.close()


@pytest.mark.parametrize("given, expected", [("not-the-passphrase-7", "wrong passphrase"), (None, "is encrypted")])
def test_a_wrong_or_missing_passphrase_is_a_clear_error(peer, bastion, tmp_path, monkeypatch, given, expected):
    key = _encrypted_key(tmp_path, peer)
    monkeypatch.setenv("SW_KEY_PASSPHRASE", given or "")
    resource = _inventory(tmp_path, peer, bastion, key=key,
                          **({"passphrase_env": "SW_KEY_PASSPHRASE"} if given else {}))
    with pytest.raises(AuthenticationFailed, match=expected) as caught:
        open_switch(resource, timeout_s=10)
    assert SECRET not in str(caught.value) and (given is None or given not in str(caught.value))


def test_route_errors_name_the_inventory_line(tmp_path, monkeypatch):
    path = tmp_path / "inventory.yaml"
    base = {"protocol": "polatis-netconf", "url": "ssh://127.0.0.1:830", "size": [4, 4], "allowed_ports": ["1-8"],
            "user": "admin"}
    monkeypatch.delenv("SW_KEY_PASSPHRASE", raising=False)
    for extra, message in (({"passphrase_env": "SW_KEY_PASSPHRASE"}, "SW_KEY_PASSPHRASE is not set"),
                           ({"proxy_jump": "root@bastion:x"}, "expected \\[user@\\]host\\[:port\\]"),
                           ({"protocol": "polatis-tl1", "url": "tcp://127.0.0.1:3082", "proxy_jump": "bastion"},
                            "only for an ssh:// switch URL")):
        path.write_text(yaml.safe_dump({"bench": {"name": "lab"}, "hosts": {}, "ocs": {"sw": {**base, **extra}}}))
        with pytest.raises(InputError, match=message) as caught:
            load_inventory(path)
        assert "inventory.yaml:" in str(caught.value)
