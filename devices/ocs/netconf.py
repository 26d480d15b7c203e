"""Polatis NETCONF driver: NETCONF over SSH (port 830) with ncclient, on Polatis' `optical-switch` YANG model.

Model and element names as Polatis publishes them (optical-switch@2018-03-22.yang, in ONOS
`models/polatis`) and as ONOS' Polatis driver (`drivers/polatis/netconf`) and lab clients build them:
- namespace `http://www.polatis.com/yang/optical-switch`;
- `cross-connects/pair` keyed by `ingress`, with a mandatory `egress` (list `pairs` before revision
  2017-08-04: the revision comes from the module capability in the server's hello, as ONOS reads it);
- `opm-power/port` (`port-id`, `power` in dBm, state data), `product-information` (state data).

Every change is one `edit-config` (pair `nc:operation="merge"` / `"delete"`), so `apply` moves all mirrors in
one transaction: on `running` when the server offers `:writable-running`, else on `candidate` followed by
`commit` (`:candidate`; the mirrors move at the commit); a server with neither is refused before anything is
sent. The switch's `rpc-error` becomes DeviceDenied with the error-tag as `code`, its error-app-tag, path and
error-info (`bad-value`, `bad-element`, yuma's `error-number`, ...) in the message.

The published model has no `unique egress` (a server without the switch behind it, such as netconfd, accepts
two pairs on one egress): the driver never sends a second feeder of an egress, and a read that shows one names
every conflicting pair (NotOneToOne) while `disconnect` of those ingresses and an `apply` that resolves them
still work, so the bench can be put back.
The port allowlist is checked before anything is sent, and every reply is validated before it is believed.
URL: `ssh://HOST[:830][?known_hosts=FILE][&identity_file=KEY]`; host keys are always checked (FILE, then
~/.ssh/known_hosts); the login is the private key KEY if named (decrypted with the resource's passphrase, from
the environment: `passphrase_env`), then the ssh-agent's keys (SSH_AUTH_SOCK), then the resource's password.
With the resource's `proxy_jump`, the switch is reached through a direct-tcpip channel of the last jump host, each
hop logged into as devices/ssh.py logs into a host's (strict host keys from FILE, else ~/.ssh/known_hosts); the
wire is stamped where ncclient writes and reads its channel, so a jump changes nothing there (read times).
"""
from __future__ import annotations

import os
import re
import socket
import threading
from collections import defaultdict
from typing import Generator, Mapping, Sequence

import paramiko
from lxml import etree

from devices import wirelog
from devices.errors import DeviceDenied, DeviceError, DeviceTimeout, TransportClosed
from devices.ocs.base import (ConfirmedState, ImpossibleState, check_allowed, check_state, confirm_planned,
                              disconnect_ports, plan_for, power_ports)
from devices.ocs.registry import OcsConfigError
from devices.protocols import Pending, SteppedSwitch
from devices.resources import HostResource, OcsResource
from devices.timing import CommandTiming, Deadline, Receipt, now_ns

OPTICAL_SWITCH_NS = "http://www.polatis.com/yang/optical-switch"
NETCONF_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
MODULE_CAPABILITY = OPTICAL_SWITCH_NS + "?module=optical-switch"
PAIR_RENAMED_REVISION = "2017-08-04"  # `pairs` -> `pair`
# RFC 6241 appendix A error-tags that describe the request itself, not the switch's momentary state
# (in-use, lock-denied, resource-denied, data-exists, operation-failed may clear: they are retried)
PERMANENT_TAGS = frozenset({"invalid-value", "too-big", "missing-attribute", "bad-attribute",
                            "unknown-attribute", "missing-element", "bad-element", "unknown-element",
                            "unknown-namespace", "access-denied", "data-missing", "operation-not-supported",
                            "malformed-message",
                            "not-one-to-one"})  # the driver's own: a read showing two feeders of one egress
WRITABLE_RUNNING = "urn:ietf:params:netconf:capability:writable-running:1.0"
CANDIDATE = "urn:ietf:params:netconf:capability:candidate:1.0"
# what an error-tag means at a switch, said once for the message (RFC 6241 appendix A)
TAG_MEANING = {
    "invalid-value": "a value the server's model refuses",
    "data-missing": "no such entry (or a mandatory one missing) on the server",
    "data-exists": "the entry exists already",
    "access-denied": "the server does not let this be written (read-only state data, or access control)",
    "unknown-element": "the server's model has no such element (another model revision?)",
    "unknown-namespace": "the server does not know this namespace",
    "operation-not-supported": "the server does not support this operation",
    "in-use": "the resource is in use",
    "lock-denied": "another session holds the lock",
}
_OS = f"{{{OPTICAL_SWITCH_NS}}}"
_NC = f"{{{NETCONF_NS}}}"
_PORT = re.compile(r"\s*\d{1,9}\s*")  # a port number (int() of a 5000-digit text would raise)


def _el(tag: str, *children, text=None, **attrib) -> etree._Element:
    element = etree.Element(tag, attrib)
    if text is not None:
        element.text = str(text)
    element.extend(children)
    return element


class NotOneToOne(ImpossibleState, DeviceDenied):
    """The server reports an egress fed by more than one ingress (its model does not forbid it). `conflicts`:
    egress -> the ingresses that the server says feed it. Never believed as a switch state; the pairs can
    still be removed (`disconnect`) or resolved by an `apply` that leaves one feeder per egress. Permanent
    (code `not-one-to-one`): no retry can choose which feeder is meant."""

    def __init__(self, what: str, conflicts: Mapping[int, Sequence[int]]):
        self.conflicts = {e: tuple(sorted(i)) for e, i in sorted(conflicts.items())}
        pairs = "; ".join(f"egress {e} fed by ingress {' and '.join(map(str, i))} "
                          f"({', '.join(f'{x}->{e}' for x in i)})" for e, i in self.conflicts.items())
        extra = sorted(x for i in self.conflicts.values() for x in i[1:])
        message = (f"{what}: not 1:1 as a switch must be: {pairs}. The server accepted a second feeder of an "
                   "egress (its model has no `unique egress`); put the bench back by disconnecting the ingress(es) "
                   f"that should not be there (e.g. `disconnect {','.join(map(str, extra))}`) or by applying the "
                   "wanted mapping")
        DeviceDenied.__init__(self, what, "not-one-to-one", message, permanent=True)
        self.args = (message,)  # the one line, not DeviceDenied's "denied by device"


def rpc_error_text(error: etree._Element) -> tuple[str, str]:
    """One `rpc-error` -> (error-tag, one line: type, message, app-tag, path, each error-info item, and what
    the tag means at a switch)."""
    def text(name: str) -> str:
        return (error.findtext(_NC + name) or "").strip()

    tag, app_tag = text("error-tag") or "operation-failed", text("error-app-tag")
    info = error.find(_NC + "error-info")
    details = [f"{etree.QName(item).localname} {(item.text or '').strip()}"
               for item in (info if info is not None else ()) if isinstance(item.tag, str)]
    parts = [" ".join(x for x in (text("error-type") and text("error-type") + " error:", text("error-message"))
                      if x) or "no error-message"]
    if app_tag:
        parts[0] += f" [{app_tag}]"
    if text("error-path"):
        parts.append(f"at {text('error-path')}")
    parts += details
    if tag in TAG_MEANING:
        parts.append(TAG_MEANING[tag])
    return tag, "; ".join(parts)


def _pair(tag: str, ingress: int, egress: int | None = None, operation: str | None = None):
    attrib = {_NC + "operation": operation} if operation else {}
    children = [_el(_OS + "ingress", text=ingress)] + ([_el(_OS + "egress", text=egress)]
                                                       if egress is not None else [])
    return _el(_OS + tag, *children, **attrib)


class NetconfSwitch(SteppedSwitch):
    """A Polatis switch over NETCONF. One RPC at a time (a lock serialises callers)."""


    def __init__(self, resource: OcsResource, endpoint, *, timeout_s: float = 30.0):
        if not resource.user:
            raise OcsConfigError(f"ocs {resource.name}: NETCONF logs in over SSH: give a user")
        self.resource = resource
        self.allowed = frozenset(resource.allowed_ports)
        self.timeout_s = float(timeout_s)
        self._endpoint = endpoint
        self._lock = threading.Lock()
        self._manager = None
        self._jump = None  # the last jump host's SshTransport (devices/ssh.py), with `proxy_jump`
        self._sent_ns = self._sent_end_ns = self._recv_ns = 0
        self.last_timing: CommandTiming | None = None
        self.pair_tag = "pair"
        self.target = "running"  # the datastore changes are written to (`candidate`: then committed)
        self._confirmed = ConfirmedState()  # what the read after our last change showed (base.plan_for)
        self._connect()

    # ---- session ------------------------------------------------------------------------------
    def _connect(self) -> None:
        from ncclient import manager, transport
        from ncclient.transport import session as nc_session

        host, port = self._endpoint.host, self._endpoint.port
        where = f"{host}:{port}" + (f" via {','.join(map(str, self.resource.proxy_jump))}"
                                    if self.resource.proxy_jump else "")
        pkey, host_key = self._private_key(where), self._pinned_key()  # before the route: nothing left open
        sock = self._dial(host, port, where)
        handler = manager.make_device_handler({"name": "default"})
        session = transport.SSHSession(handler)  # manager.connect's steps, with the key already read (below)
        ncclient_auth = getattr(session, "_auth", None)
        if ncclient_auth is None:
            self._close_route(sock)
            raise DeviceError(f"NETCONF {where}: ncclient {_ncclient_version()} lacks SSHSession._auth, which this "
                              "driver logs in through (found in ncclient 0.6.15 to 0.7.1): use a version of that range")

        def auth(username, password, key_filenames, allow_agent, look_for_keys):
            """The pinned key, decrypted here (ncclient would take the password for its passphrase and offer
            that passphrase to the switch as a password), then ncclient's own: the agent's keys, the password."""
            if pkey is not None:
                try:
                    session.transport.auth_publickey(username, pkey)
                    return
                except paramiko.AuthenticationException:
                    pass
            ncclient_auth(username, password, key_filenames, allow_agent, look_for_keys)

        session._auth = auth
        try:
            session.connect(host=host, port=port, sock=sock, username=self.resource.user,
                            password=self.resource.password, hostkey_verify=True, hostkey_b64=host_key,
                            key_filename=None, allow_agent=True, look_for_keys=False, timeout=self.timeout_s)
        except Exception as exc:  # ncclient raises SSHError, AuthenticationError, SessionError...
            if session.transport:
                session.close()
            self._close_route(sock)
            raise DeviceError(f"NETCONF {where}: {type(exc).__name__}: {exc}") from exc
        self._manager = manager.Manager(session, handler, timeout=self.timeout_s)
        session = self._manager._session  # stamp the real channel write and read (see _READER_TICK_S)
        missing = _missing_internals(session, nc_session)
        if missing:
            self._manager = None
            session.close()
            self._close_route(None)
            raise DeviceError(f"NETCONF {where}: ncclient {_ncclient_version()} lacks {', '.join(missing)}, which this "
                              "driver stamps the wire through (its writes and reads; found in ncclient 0.6.15 to "
                              "0.7.1): use a version of that range")
        self._hello_sent(where)
        write, read = session._transport_write, session._transport_read

        def stamped_write(data):
            if self._sent_ns:
                started, written = now_ns(), write(data)
            else:
                self._sent_ns = started = now_ns()
                written = write(data)
                self._sent_end_ns = now_ns()
            wirelog.record(started, wire_peer, ">", data[:max(written, 0)])
            return written

        def stamped_read():
            data = read()
            self._recv_ns = now_ns()
            wirelog.record(self._recv_ns, wire_peer, "<", data)
            return data

        wire_peer = f"netconf://{host}:{port}"

        session._transport_write, session._transport_read = stamped_write, stamped_read

        def send_now(message: str) -> None:
            """ncclient's `send` queues a message for its reader loop, which writes it when it next wakes
            (TICK: 0.1 s; shortened, that loop woke 500 times a second): written here instead, framed as that
            loop frames it. Only callers write, each holding `_lock` (`_rpc_steps`, `close`); the loop only reads."""
            if not session.connected:
                raise nc_session.TransportError("Not connected to NETCONF server")
            data = message.encode()
            if session._base == nc_session.NetconfBase.BASE_11:
                data = b"\n#%d\n%s%s" % (len(data), data, nc_session.END_DELIM)
            else:
                data += nc_session.MSG_DELIM
            while data:
                n = stamped_write(data)
                if n <= 0:
                    raise nc_session.SessionCloseError(session._buffer.getvalue(), data)
                data = data[n:]

        session.send = send_now
        capabilities = list(self._manager.server_capabilities)
        self.pair_tag = self._pair_tag(capabilities)
        self.target = _writable_target(capabilities)

    def _hello_sent(self, where: str) -> None:
        """ncclient queues our hello for its reader loop, which writes it once the channel is ready to send — on
        a loaded machine only after the server's hello came in and `connect` returned. A request written directly
        (`send_now`) could then go out before our hello, and a strict server (yuma123 netconfd) never answers it.
        One first request through ncclient's own queue leaves after the hello, in order: once it is answered,
        whatever it says, the hello is out and the direct path is safe."""
        from ncclient.operations.rpc import RPCError

        subtree = f'<cross-connects xmlns="{OPTICAL_SWITCH_NS}"/>'
        try:
            self._manager.get_config(source="running", filter=("subtree", subtree))
        except RPCError:
            pass  # an rpc-error answers too: the server read our hello
        except Exception as exc:
            self._drop()
            raise DeviceError(f"NETCONF {where}: no answer after the hello exchange: {type(exc).__name__}: {exc}") \
                from exc

    def _dial(self, host: str, port: int, where: str):
        """A TCP socket to the switch; with `proxy_jump`, a direct-tcpip channel to it from the last jump host,
        each hop logged into as a host is (devices/ssh.py: strict host keys on every hop)."""
        hops = self.resource.proxy_jump
        if not hops:
            try:
                sock = socket.create_connection((host, port), timeout=self.timeout_s)
            except OSError as exc:
                raise TransportClosed(f"NETCONF {where}: cannot connect: {exc}") from exc
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # 44 ms per RPC otherwise
            return sock
        from devices.ssh import SshTransport

        *before, last = hops
        key = self._endpoint.option("identity_file")
        jump = SshTransport(HostResource(
            name=f"{self.resource.name}'s jump host", address=last.address, port=last.port, user=last.user,
            identity_file=last.identity_file, known_hosts=last.known_hosts, proxy_jump=tuple(before),
            passphrase=self.resource.passphrase if last.identity_file == key else None),
            connect_timeout=self.timeout_s, retries=0)
        try:
            channel = jump._transport().open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0),
                                                     timeout=self.timeout_s)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            jump.close()
            raise TransportClosed(f"NETCONF {where}: cannot forward to {host}:{port} from jump host {last} "
                                  f"(AllowTcpForwarding there?): {exc}") from None
        except BaseException:
            jump.close()
            raise
        self._jump = jump
        return channel

    def _close_route(self, sock) -> None:
        if sock is not None:
            sock.close()
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def _private_key(self, where: str) -> paramiko.PKey | None:
        """The URL's `identity_file`, decrypted with `passphrase_env`'s passphrase (devices/ssh.py: a clear
        error for an encrypted key without one or a wrong one, never saying it)."""
        from devices.ssh import _private_key

        path = self._endpoint.option("identity_file")
        if path is None:
            return None
        if not os.path.isfile(os.path.expanduser(path)):
            raise OcsConfigError(f"ocs {self.resource.name}: identity_file {path!r} does not exist")
        return _private_key(path, self.resource.passphrase, f"NETCONF {where}")

    def _pinned_key(self) -> str | None:
        """The host key for this switch from `?known_hosts=FILE`, or None (ncclient then checks
        ~/.ssh/known_hosts and refuses an unknown host)."""
        path = self._endpoint.option("known_hosts")
        if not path:
            return None
        try:
            keys = paramiko.HostKeys(os.path.expanduser(path))
        except OSError as exc:
            raise OcsConfigError(f"ocs {self.resource.name}: known_hosts {path!r}: {exc}") from None
        host, port = self._endpoint.host, self._endpoint.port
        for name in (f"[{host}]:{port}", host):
            entry = keys.lookup(name)
            if entry:
                return next(iter(entry.values())).get_base64()
        raise DeviceError(f"NETCONF {host}:{port}: no host key for it in {path}; refusing to connect")

    @staticmethod
    def _pair_tag(capabilities: list[str]) -> str:
        for uri in capabilities:
            if uri.startswith(MODULE_CAPABILITY):
                revision = dict(part.partition("=")[::2] for part in uri.partition("?")[2].split("&"))
                return "pairs" if revision.get("revision", "9999") < PAIR_RENAMED_REVISION else "pair"
        raise DeviceError("NETCONF server does not advertise the Polatis optical-switch YANG module "
                          f"({MODULE_CAPABILITY}); is this a Polatis switch?")

    def reconnect(self) -> None:
        """A fresh NETCONF session after a timeout or a dropped connection (the old one is abandoned)."""
        with self._lock:
            self._drop()
            self._connect()

    def _drop(self) -> None:
        self._confirmed.forget()
        if self._manager is not None:
            try:
                self._manager._session.close()
            except Exception:  # a dead transport cannot be closed more
                pass
            self._manager = None
        self._close_route(None)

    def close(self) -> None:
        with self._lock:
            if self._manager is not None and self._manager.connected:
                try:
                    self._manager.timeout = min(self.timeout_s, 2.0)
                    self._manager.close_session()
                except Exception:  # logging out of a dead session is best effort
                    pass
            self._drop()

    # ---- raw protocol ---------------------------------------------------------------------------
    def rpc(self, what: str, call):
        """Run one ncclient operation `call(manager)`; map its errors to ours and set last_timing."""
        return Pending(self._rpc_steps(what, call)).finish()

    def _rpc_steps(self, what: str, call) -> Generator[int, None, object]:
        """`rpc`'s steps (devices.protocols.Pending), yielding once the request is written: in ncclient's
        asynchronous mode the operation returns once sent, and `send_now` has written it on this thread; the
        reply is awaited and checked after the yield as its synchronous mode does. The session's lock is held
        throughout."""
        from ncclient.operations import RPCError, TimeoutExpiredError
        from ncclient.transport import TransportError
        from ncclient.xml_ import to_ele

        with self._lock:
            if self._manager is None or not self._manager.connected:
                raise TransportClosed(f"NETCONF {self._endpoint.host}:{self._endpoint.port}: session closed")
            self._sent_ns = 0
            manager = self._manager
            manager.timeout = self.timeout_s  # callers may change the deadline between calls
            deadline = Deadline(self.timeout_s)
            manager.async_mode = True
            try:
                request = call(manager)  # written (`send_now`), its reply to come
            except TransportError as exc:
                self._confirmed.forget()
                raise TransportClosed(f"{what}: NETCONF session lost: {exc}") from exc
            finally:
                manager.async_mode = False
            yield self._sent_ns or now_ns()
            try:
                if not request.event.wait(deadline.remaining()):
                    raise TimeoutExpiredError("ncclient timed out while waiting for an rpc reply.")
                if request.error is not None:  # what kept the reply from being delivered
                    raise request.error
                reply = request.reply
                reply.parse()
                if reply.error is not None:  # ncclient's default raise mode: every rpc-error
                    errors = reply.errors
                    raise RPCError(to_ele(reply._raw), errs=errors) if len(errors) > 1 else reply.error
            except RPCError as exc:
                self._confirmed.forget()  # a refused change may have been partly made: read before the next
                self.last_timing = self._timing()
                errors = [rpc_error_text(e) for e in to_ele(reply._raw).iter(_NC + "rpc-error")
                          if (e.findtext(_NC + "error-severity") or "error").strip() != "warning"]
                errors = errors or [(exc.tag or "operation-failed", str(exc))]
                tag = errors[0][0]
                raise DeviceDenied(what, tag, " | ".join(text for _, text in errors)[:1000],
                                   permanent=tag in PERMANENT_TAGS) from None
            except TimeoutExpiredError as exc:
                self._confirmed.forget()
                raise DeviceTimeout(f"{what}: no rpc-reply within {manager.timeout} s") from exc
            except TransportError as exc:
                self._confirmed.forget()
                raise TransportClosed(f"{what}: NETCONF session lost: {exc}") from exc
            except Exception as exc:  # a reply ncclient cannot read (bad XML, unknown message-id, ...)
                self._drop()  # its stream cannot be trusted any more: the next call asks for reconnect()
                raise DeviceError(f"{what}: unreadable rpc-reply ({type(exc).__name__}: {exc})"[:300]) from exc
            self.last_timing = self._timing()
        return reply

    def _timing(self) -> CommandTiming:
        """The rpc's write and the read that completed its reply: a read time (paramiko gives no kernel
        stamp, and an SSH packet is not the reply until decrypted), bounded back to the write."""
        if not self._sent_ns:
            self._sent_ns = self._sent_end_ns = now_ns()
        how = "read (NETCONF over SSH" + (" through a jump host's channel)" if self.resource.proxy_jump else ")")
        return CommandTiming.of((self._sent_ns, self._sent_end_ns), Receipt(self._recv_ns, 0, 0, how))

    def _get(self, what: str, subtree: etree._Element, config: bool = False) -> etree._Element:
        if config:
            reply = self.rpc(what, lambda m: m.get_config(source="running", filter=("subtree", subtree)))
        else:
            reply = self.rpc(what, lambda m: m.get(filter=("subtree", subtree)))
        data = reply.data_ele
        if data is None or etree.QName(data).localname != "data":
            raise DeviceError(f"{what}: rpc-reply without <data>")
        return data

    def _edit(self, what: str, *top: etree._Element) -> CommandTiming:
        return Pending(self._edit_steps(what, *top)).finish()

    def _edit_steps(self, what: str, *top: etree._Element) -> Generator[int, None, CommandTiming]:
        """One edit-config on `running`; with `:candidate` only, `lock` the candidate (refused while it holds
        someone's uncommitted changes, which our commit would carry: resource-denied, retried), edit it,
        `commit` (the change: its write is the yield, its <ok/> the completion) and `unlock`. A refused edit or
        commit is followed by `discard-changes`; a session lost meanwhile takes our changes with its lock."""
        self._confirmed.forget()  # a change: plan the next apply from a read, unless apply confirms it
        config = _el(_NC + "config", *top)
        if self.target is None:
            raise DeviceDenied(what, "operation-not-supported",
                               "the server offers neither :writable-running nor :candidate, so no change can be "
                               "written; nothing was sent", permanent=True)
        if self.target == "running":
            reply = yield from self._rpc_steps(what, lambda m: m.edit_config(target="running", config=config))
        else:
            self.rpc(what + " (lock candidate)", lambda m: m.lock("candidate"))
            try:
                self._expect_ok(what + " (candidate)", self.rpc(
                    what + " (candidate)", lambda m: m.edit_config(target="candidate", config=config)))
                reply = yield from self._rpc_steps(what + " (commit)", lambda m: m.commit())
            except DeviceDenied:
                self._quietly("discard-changes", lambda m: m.discard_changes())
                raise
            finally:
                self._quietly("unlock candidate", lambda m: m.unlock("candidate"))
        self._expect_ok(what, reply)
        return self.last_timing

    @staticmethod
    def _expect_ok(what: str, reply) -> None:
        if not reply.ok:
            raise DeviceError(f"{what}: rpc-reply without <ok/>")

    def _quietly(self, what: str, call) -> None:
        """A clean-up RPC that leaves `last_timing` (the change's) and any error of its own unsaid: what led
        here is what the caller must see, and a session too broken to clean up releases its lock as it ends."""
        timing = self.last_timing
        try:
            self.rpc(what, call)
        except DeviceError:
            pass
        self.last_timing = timing

    # ---- CircuitSwitch --------------------------------------------------------------------------
    def identify(self) -> str:
        data = self._get("get product-information", _el(_OS + "product-information"))
        info = data.find(_OS + "product-information")
        if info is None:
            raise DeviceError(_not_provided("product-information", "identify"))
        fields = [info.findtext(_OS + name, "").strip()
                  for name in ("manufacturer", "model-name", "serial-number", "software-version")]
        return ",".join(fields)

    def _events_added(self) -> int:
        """No autonomous messages: the driver does not subscribe to notifications (base.plan_for)."""
        return 0

    def patches(self) -> dict[int, int]:
        patches = self._read_patches()[0]
        conflicts = _conflicts(patches)
        if conflicts:
            raise NotOneToOne(f"{self.resource.name}: cross-connects", conflicts)
        return patches

    def _read_patches(self) -> tuple[dict[int, int], CommandTiming]:
        """ingress -> egress as the server reports them, every port checked against the switch's size. A
        second feeder of an egress is kept in (`_conflicts`): `patches` refuses it, `disconnect` removes it,
        `apply` may resolve it (`plan_for` reads through here)."""
        data = self._get("get-config cross-connects", _el(_OS + "cross-connects"), config=True)
        pairs: list[tuple[int, int]] = []
        containers = data.findall(_OS + "cross-connects")
        for pair in (p for c in containers for p in c):
            if etree.QName(pair).localname != self.pair_tag:
                raise DeviceError(f"cross-connects: unexpected element {etree.QName(pair).localname!r}")
            ingress, egress = pair.findtext(_OS + "ingress"), pair.findtext(_OS + "egress")
            if not (_PORT.fullmatch(ingress or "") and _PORT.fullmatch(egress or "")):
                raise DeviceError(f"cross-connects: malformed {self.pair_tag} "
                                  f"{etree.tostring(pair, encoding=str)[:120]!r}")
            pairs.append((int(ingress), int(egress)))
        what = f"{self.resource.name}: cross-connects"
        egresses: dict[int, list[int]] = defaultdict(list)
        for ingress, egress in pairs:
            check_state([(ingress, egress)], self.resource.size, what)  # its ports on this switch
            egresses[ingress].append(egress)
        for ingress, ends in egresses.items():  # the list's key: a server that breaks it is not believed at all
            if len(ends) > 1:
                raise ImpossibleState(f"{what}: ingress {ingress} connected twice (to "
                                      f"{' and '.join(map(str, ends))}) on a 1:1 switch")
        return dict(pairs), self.last_timing

    def _connections(self, *pairs: etree._Element) -> etree._Element:
        return _el(_OS + "cross-connects", *pairs)

    def connect(self, ingress: int, egress: int) -> CommandTiming:
        """`create` as is: a patched ingress is the switch's error (data-exists; `apply` reconciles). A busy
        egress is refused here, after a read, with the switch's own tag (in-use): the model lets a server
        accept a second feeder of an egress, which no switch can have. Ports the switch does not have are left
        for the switch to refuse (its invalid-value says which)."""
        ingress, egress = int(ingress), int(egress)
        what = f"edit-config create {ingress}->{egress}"
        check_allowed(self.allowed, (ingress, egress), f"connect {ingress}->{egress}")
        n, m = self.resource.size
        on_switch = not (n and m) or (1 <= ingress <= n < egress <= n + m)
        feeders = sorted(i for i, e in self._read_patches()[0].items()
                         if e == egress and i != ingress) if on_switch else []
        if feeders:
            raise DeviceDenied(what, "in-use", f"egress {egress} is already fed by ingress "
                               f"{' and '.join(map(str, feeders))} (read just now); nothing was sent")
        return self._edit(what, self._connections(_pair(self.pair_tag, ingress, egress, "create")))

    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming:
        """`delete` as is: an ingress without a pair is the switch's error (data-missing). Works on a state
        that is not 1:1 (NotOneToOne), to remove the pair that should not be there."""
        ingresses = [int(i) for i in ingresses]
        check_allowed(self.allowed, ingresses, "disconnect")  # before the read
        ingresses = disconnect_ports(self, ingresses, current=self._read_patches()[0])
        return self._edit(f"edit-config delete {','.join(map(str, ingresses))}",
                          self._connections(*(_pair(self.pair_tag, i, operation="delete") for i in ingresses)))

    def _apply_steps(self, mapping: Mapping[int, int], exclusive: bool) -> Generator[int, None, CommandTiming]:
        """`apply`'s steps, yielding once the edit-config is written (its <ok/>: the mirrors settled). One
        edit-config: `delete` the conflicting pairs, `merge` the wanted ones (moves included)."""
        planned = plan_for(self, mapping, exclusive)
        plan = planned.plan
        left = _conflicts(planned.expected)
        if left:  # a state that is not 1:1 (read as it is: `_read_patches`) that this apply would not resolve
            raise NotOneToOne(f"{self.resource.name}: cross-connects (apply {dict(mapping)} would leave them; "
                              "nothing was sent)", left)
        if plan.empty:
            return planned.read
        edits = [_pair(self.pair_tag, i, operation="delete") for i in sorted(plan.removes) if i not in plan.adds]
        edits += [_pair(self.pair_tag, i, e, "merge") for i, e in sorted(plan.adds.items())]
        timing = yield from self._edit_steps(f"edit-config apply {dict(sorted(plan.adds.items()))}",
                                             self._connections(*edits))
        confirm_planned(self, planned, mapping)
        return timing

    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        ports = power_ports(self, ports)
        if not ports:
            return {}
        subtree = _el(_OS + "opm-power", *(_el(_OS + "port", _el(_OS + "port-id", text=p), _el(_OS + "power"))
                                            for p in ports))
        data = self._get("get opm-power", subtree)
        if data.find(_OS + "opm-power") is None:
            raise DeviceError(_not_provided("opm-power", "port power"))
        power: dict[int, float] = {}
        for port in data.iterfind(f"{_OS}opm-power/{_OS}port"):
            try:
                power[int(port.findtext(_OS + "port-id"))] = float(port.findtext(_OS + "power"))
            except (TypeError, ValueError):
                raise DeviceError(f"opm-power: malformed port {etree.tostring(port, encoding=str)[:120]!r}") \
                    from None
        missing = [p for p in ports if p not in power]
        if missing:
            raise DeviceError(f"opm-power returned no power for port(s) {missing}")
        return {p: power[p] for p in ports}


def _conflicts(patches: Mapping[int, int]) -> dict[int, list[int]]:
    """egress -> its ingresses, for every egress that more than one ingress feeds."""
    feeders: dict[int, list[int]] = defaultdict(list)
    for ingress, egress in patches.items():
        feeders[egress].append(ingress)
    return {e: sorted(i) for e, i in sorted(feeders.items()) if len(i) > 1}


def _writable_target(capabilities: list[str]) -> str | None:
    """The datastore a change is written to: `running` with :writable-running, else `candidate` (then
    committed) with :candidate, else None (no change can be made)."""
    offered = {uri.partition("?")[0] for uri in capabilities}
    if WRITABLE_RUNNING in offered:
        return "running"
    return "candidate" if CANDIDATE in offered else None


def _not_provided(container: str, what: str) -> str:
    return (f"get {container}: the server returned no {container}: it does not provide this state data, so "
            f"{what} is not available from it (a NETCONF server without the switch's instrumentation behind "
            "it, e.g. netconfd with the model alone, serves configuration only)")


# What `_connect` uses of ncclient beyond its public API, to stamp the wire: the session's own write and read of
# the channel, its framing state, and the framing constants (ncclient 0.6.15 to 0.7.1 have them all).
_SESSION_INTERNALS = ("_transport_write", "_transport_read", "_base", "_buffer", "connected")
_MODULE_INTERNALS = ("NetconfBase", "END_DELIM", "MSG_DELIM")


def _missing_internals(session, module) -> list[str]:
    missing = [f"session.{name}" for name in _SESSION_INTERNALS if not hasattr(session, name)]
    missing += [f"ncclient.transport.session.{name}" for name in _MODULE_INTERNALS if not hasattr(module, name)]
    if hasattr(module, "NetconfBase") and not hasattr(module.NetconfBase, "BASE_11"):
        missing.append("NetconfBase.BASE_11")
    return missing


def _ncclient_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ncclient")
    except PackageNotFoundError:
        return "(version unknown)"
