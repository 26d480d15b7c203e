"""Emulated Polatis NETCONF server: a paramiko SSH server with the `netconf` subsystem (RFC 6242), one more
management view of the emulated switch behind `OcsServers` (the same state, logins, settle times, faults).

Wire behaviour:
- hello with base:1.0, base:1.1 (unless `base11=False`), :writable-running and the module capability
  `http://www.polatis.com/yang/optical-switch?module=optical-switch&revision=R`; after the hellos both
  sides use chunked framing (`\\n#LEN\\n...\\n##\\n`) when both offered base:1.1, else `]]>]]>`.
- `get` (state + config) and `get-config` (`running`) with RFC 6241 §6 subtree filters over
  `product-information`, `port-config`, `opm-power` and `cross-connects` of optical-switch@2018-03-22;
- `target="running"` (default, :writable-running), `"candidate"` (:candidate only, as netconfd's default:
  `edit-config` on `candidate`, `commit` moves the mirrors, `discard-changes`; writing `running` is
  operation-failed "cannot write to this configuration directly") or None (neither);
- `edit-config`: pair `operation` merge / create / replace / delete / remove (qualified
  `nc:operation` as RFC 6241 has it, or unqualified as ONOS sends it), `default-operation` merge or none;
  the whole edit is validated first and applied as one change (all or nothing), and `<ok/>` is sent when
  the bench says the mirrors settle;
- `lock` / `unlock` of `running`, `close-session`;
- `rpc-error`s as yuma123's netconfd writes them with the same model (captured from netconfd 2.13 with
  optical-switch@2018-03-22, tests/test_netconf_peer.py compares them): the tag, error-type, error-app-tag,
  error-path (the request's path, `/nc:rpc/nc:edit-config/nc:config/opsw:...`, or the data's for a
  mandatory leaf missing after the edit) and error-info (`bad-element` with its prefix, `bad-value` in the
  yuma-ncx namespace; not yuma's own `error-number`): invalid-value / not-in-range (a port this switch does
  not have; a datastore it has not: "config not found"), bad-element (not a number), data-missing (no pair to
  delete: data-incomplete; a pair without its mandatory egress: instance-required), data-exists,
  access-denied (state data written: no-access), unknown-element, unknown-namespace, bad-attribute,
  operation-not-supported (commit, discard-changes, ... without :candidate), malformed-message,
  missing-attribute, lock-denied. Unlike netconfd, it refuses a second pair on one egress (in-use), as the
  switch behind it must: the model does not say so, a switch cannot do it;
- `last-modified` on get / get-config replies, as netconfd sends it.
"""
from __future__ import annotations

import itertools
import logging
import re
import socket
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import paramiko

from devices.emulated.switching import OcsRefusal
from devices.emulated.host.ssh import CLOSE_AFTER_S, accept_ssh, forget_accepted, generate_ed25519
from devices.timing import now_ns

log = logging.getLogger(__name__)

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OS_NS = "http://www.polatis.com/yang/optical-switch"
NC, OS = f"{{{NC_NS}}}", f"{{{OS_NS}}}"
BASE_10, BASE_11 = "urn:ietf:params:netconf:base:1.0", "urn:ietf:params:netconf:base:1.1"
EOM = b"]]>]]>"
_CHUNK = re.compile(rb"\n#([1-9][0-9]{0,9})\n")
_MAX_MESSAGE = 16 << 20
# the switch's refusal kinds (OcsRefusal.KINDS) as NETCONF error-tags (RFC 6241 appendix A)
_TAGS = {"invalid_port": "invalid-value", "port_in_use": "in-use", "egress_in_use": "in-use",
         "no_patch": "data-missing", "listed_twice": "data-missing", "lists_differ": "data-missing", "unsupported": "data-missing",
         "not_equipped": "operation-failed"}
NCX_NS = "http://netconfcentral.org/ns/yuma-ncx"  # where netconfd puts `bad-value` (RFC 6241 names none)
BAD_VALUE = f"{{{NCX_NS}}}bad-value"
EDIT = "/nc:rpc/nc:edit-config/nc:config"  # netconfd's error-path of what an edit-config carries
# NETCONF operations this server knows of but does not offer (no :candidate, :startup, :validate, ...)
_NOT_OFFERED = {"commit", "discard-changes", "cancel-commit", "validate", "copy-config", "delete-config",
                "kill-session", "partial-lock", "partial-unlock", "create-subscription", "get-schema"}


@dataclass
class RpcError(Exception):
    tag: str
    message: str
    type: str = "application"
    path: str = ""
    info: tuple[tuple[str, str], ...] = ()  # (tag or {namespace}tag, text)
    app_tag: str = ""


class _Closed(Exception):
    """The client went away, or broke the framing (RFC 6242: the session ends)."""


class _Framing:
    """Reads one message at a time: `]]>]]>`-delimited (1.0) or chunked (1.1)."""

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel
        self.buffer = b""
        self.chunked = False

    def _more(self) -> None:
        data = self.channel.recv(65536)
        if not data:
            raise _Closed("client closed the channel")
        self.buffer += data
        if len(self.buffer) > _MAX_MESSAGE:
            raise _Closed("message too large")

    def read(self) -> bytes:
        if not self.chunked:
            while EOM not in self.buffer:
                self._more()
            message, _, self.buffer = self.buffer.partition(EOM)
            return message
        parts: list[bytes] = []
        while True:
            while len(self.buffer) < 4:
                self._more()
            if self.buffer.startswith(b"\n##\n"):
                self.buffer = self.buffer[4:]
                return b"".join(parts)
            match = _CHUNK.match(self.buffer)
            if match is None:
                if len(self.buffer) > 14 or not self.buffer.startswith(b"\n#"):
                    raise _Closed(f"bad chunk header {self.buffer[:14]!r}")
                self._more()
                continue
            size = int(match.group(1))
            while len(self.buffer) < match.end() + size:
                self._more()
            parts.append(self.buffer[match.end():match.end() + size])
            self.buffer = self.buffer[match.end() + size:]

    def frame(self, payload: bytes) -> bytes:
        return b"\n#%d\n%s\n##\n" % (len(payload), payload) if self.chunked else payload + EOM


def _text(element: ET.Element | None) -> str:
    return (element.text or "").strip() if element is not None else ""


def _operation(element: ET.Element, default: str) -> str:
    return element.get(NC + "operation") or element.get("operation") or default


def subtree_filter(data: ET.Element, selection: ET.Element) -> ET.Element | None:
    """RFC 6241 §6 subtree filtering of `data` (same tag as `selection`): the part of `data` it selects."""
    children = list(selection)
    if not children:
        wanted = _text(selection)
        if wanted and _text(data) != wanted:
            return None  # content match node that does not match
        return data
    content = [c for c in children if not len(c) and _text(c)]
    for match in content:
        found = [d for d in data if d.tag == match.tag]
        if not any(_text(d) == _text(match) for d in found):
            return None
    others = [c for c in children if c not in content]
    if not others:
        return data  # only content match nodes, all matched: the whole entry
    out = ET.Element(data.tag, data.attrib)
    out.extend(d for d in data if any(d.tag == c.tag for c in content))
    taken: set[int] = set()
    for child_filter in others:
        for child in data:
            if child.tag == child_filter.tag and id(child) not in taken:
                picked = subtree_filter(child, child_filter)
                if picked is not None:
                    out.append(picked)
                    taken.add(id(child))
    if content or len(out):
        return out
    return None


def _leaf(tag: str, value) -> ET.Element:
    element = ET.Element(tag)
    element.text = str(value)
    return element


class NetconfServer:
    """NETCONF over SSH on `host`:`port` (0: ephemeral) in front of `servers` (an `OcsServers`)."""

    def __init__(self, servers, host: str = "127.0.0.1", port: int = 0, *, base11: bool = True,
                 revision: str = "2018-03-22", target: str | None = "running"):
        """`base11=False`: offer NETCONF 1.0 only (`]]>]]>` framing). `revision`: of optical-switch; before
        2017-08-04 the cross-connects list is `pairs`. `target`: where changes are written, as netconfd's
        `--target`: "running" (:writable-running), "candidate" (:candidate: edit the candidate, `commit` moves
        the mirrors, `discard-changes`), or None (neither: a read-only server)."""
        if target not in ("running", "candidate", None):
            raise ValueError(f"target {target!r}: running, candidate or None")
        self.target = target
        self._candidate: tuple[dict[int, int], dict[int, tuple[str, str]]] | None = None  # None: as running
        self.servers = servers
        self.bench = servers.bench
        self.host = host
        self.port = port
        self.base11 = base11
        self.revision = revision
        self.pair_tag = "pairs" if revision < "2017-08-04" else "pair"  # renamed in that revision
        self.labels: dict[int, tuple[str, str]] = {}  # port-config label, peer-port (config)
        self._session_ids = itertools.count(1)
        self._locks: dict[str, int] = {}  # datastore -> the session holding its lock
        self.last_modified = _utc_now()  # of running, as netconfd reports it on its data replies
        self._state_lock = threading.Lock()
        self._dir: tempfile.TemporaryDirectory | None = None
        self._listener: socket.socket | None = None
        self._transports: list[paramiko.Transport] = []
        self._running = False
        self.host_key: paramiko.PKey | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    @property
    def known_hosts_path(self) -> Path:
        return Path(self._dir.name) / "known_hosts"

    @property
    def url(self) -> str:
        return f"ssh://{self.host}:{self.port}?known_hosts={self.known_hosts_path}"

    @property
    def description(self) -> str:
        return (f"NETCONF ssh://{self.host}:{self.port} (ssh -s netconf; host key in {self.known_hosts_path})")

    def start(self) -> "NetconfServer":
        self._dir = tempfile.TemporaryDirectory(prefix="ocs-hil-netconf-")
        self.host_key = generate_ed25519(Path(self._dir.name) / "ssh_host_ed25519_key")
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.host, self.port))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.known_hosts_path.write_text(
            f"[{self.host}]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n")
        self._running = True
        threading.Thread(target=self._serve, name="netconf-listen", daemon=True).start()
        return self

    def stop(self) -> None:
        self._running = False
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        for transport in list(self._transports):
            transport.close()
        self._transports = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "NetconfServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _serve(self) -> None:
        for transport in accept_ssh(self._listener, self.host_key, lambda: _SshAuth(self), lambda: self._running):
            self._transports = [t for t in self._transports if t.is_active()] + [transport]

    # ---- one session ----------------------------------------------------------------------------
    def session(self, channel: paramiko.Channel) -> None:
        forget_accepted(channel)
        session_id = next(self._session_ids)
        framing = _Framing(channel)
        try:
            capabilities = [BASE_10] + ([BASE_11] if self.base11 else []) + [
                f"urn:ietf:params:netconf:capability:{capability}:1.0"
                for capability in {"running": ["writable-running"], "candidate": ["candidate"]}.get(self.target, [])
            ] + [f"{OS_NS}?module=optical-switch&revision={self.revision}"]
            hello = ET.Element(NC + "hello")
            caps = ET.SubElement(hello, NC + "capabilities")
            for uri in capabilities:
                ET.SubElement(caps, NC + "capability").text = uri
            ET.SubElement(hello, NC + "session-id").text = str(session_id)
            channel.sendall(self._xml(hello) + EOM)  # the hello is always 1.0-framed
            client = ET.fromstring(framing.read())
            if client.tag != NC + "hello":
                raise _Closed("first message is not a hello")
            offered = {_text(c) for c in client.iter(NC + "capability")}
            framing.chunked = self.base11 and BASE_11 in offered
            while True:
                raw = framing.read()
                reply, done = self._handle(raw, session_id)
                if reply is not None:
                    channel.sendall(framing.frame(reply))
                if done:
                    break
        except _Closed as exc:
            log.debug("netconf session %d ends: %s", session_id, exc)
            if str(exc).startswith(("garbage", "drop_chars")):
                channel.get_transport().close()
                return
        except (ET.ParseError, OSError, EOFError) as exc:
            log.debug("netconf session %d ends: %s", session_id, exc)
        finally:
            with self._state_lock:
                for store in [s for s, owner in self._locks.items() if owner == session_id]:
                    del self._locks[store]
                    if store == "candidate":  # RFC 6241 §8.3.5.2: its changes go with the lock
                        self._candidate = None
            try:
                channel.send_exit_status(0)  # as sshd reports the end of a subsystem
                channel.shutdown_write()  # EOF; the client closes (spec/feasibility.md §1)
                # or leaves it to us: a stock `ssh -s` waits for the server's close (the hosts' reaper: same wait)
                channel.status_event.wait(CLOSE_AFTER_S)
                channel.close()
            except (OSError, EOFError):
                pass

    @staticmethod
    def _xml(element: ET.Element) -> bytes:
        ET.register_namespace("", NC_NS)
        ET.register_namespace("ncx", NCX_NS)
        return b'<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(element)

    def _handle(self, raw: bytes, session_id: int) -> tuple[bytes | None, bool]:
        """One message in, the reply out (None: swallowed by an injected fault) and whether to end."""
        try:
            rpc = ET.fromstring(raw)
        except ET.ParseError as exc:
            return self._reply({}, error=RpcError("malformed-message", f"not XML: {exc}", "rpc")), False
        if rpc.tag != NC + "rpc":
            return self._reply({}, error=RpcError("unknown-element", f"expected <rpc>, got {rpc.tag}",
                                                  "rpc", info=(("bad-element", rpc.tag),))), False
        attrs = dict(rpc.attrib)
        if "message-id" not in attrs:
            return self._reply(attrs, error=RpcError("missing-attribute", "rpc without message-id", "rpc",
                                                     info=(("bad-attribute", "message-id"),
                                                           ("bad-element", "rpc")))), False
        operation = rpc[0] if len(rpc) else None
        name = operation.tag.removeprefix(NC) if operation is not None else ""
        changes = "commit" if self.target == "candidate" else "edit-config"  # what moves the mirrors
        fault = self.servers.faults.take(raw.decode(errors="replace"), name == changes)
        if fault == "silence":
            return None, False
        if fault == "deny":
            return self._reply(attrs, error=RpcError("in-use", "Switch busy")), False
        try:
            handler = {"get": self._get, "get-config": self._get_config, "edit-config": self._edit_config,
                       "lock": self._lock, "unlock": self._unlock,
                       "close-session": lambda op, sid: None}.get(name)
            if self.target == "candidate":
                handler = handler or {"commit": self._commit, "discard-changes": self._discard_changes}.get(name)
            if handler is None:
                if name in _NOT_OFFERED:
                    raise RpcError("operation-not-supported", f"operation not supported: {name}", "protocol",
                                   app_tag="no-support")
                local = (name or "(none)").rpartition("}")[2]
                prefix = "nc:" if operation is not None and operation.tag.startswith(NC) else ""
                raise RpcError("unknown-element", f"definition not found for {local}", "rpc",
                               path=f"/nc:rpc/{prefix}{local}", app_tag="data-incomplete",
                               info=(("bad-element", prefix + local),))
            body = handler(operation, session_id)
            reply = self._reply(attrs, body=body)
            if name in ("get", "get-config"):
                stamp = b'<rpc-reply last-modified="%s" ' % self.last_modified.encode()
                reply = reply.replace(b"<rpc-reply ", stamp, 1)
        except RpcError as error:
            reply = self._reply(attrs, error=error)
        if fault in ("garbage", "drop_chars"):
            # Line noise cannot reach NETCONF: SSH's MAC fails and sshd drops the connection instead.
            raise _Closed(f"{fault}: the SSH transport fails its integrity check")
        return reply, name == "close-session"

    def _reply(self, attrs: dict, body: ET.Element | None = None, error: RpcError | None = None) -> bytes:
        reply = ET.Element(NC + "rpc-reply", attrs)
        if error is not None:
            rpc_error = ET.SubElement(reply, NC + "rpc-error")
            for tag, value in (("error-type", error.type), ("error-tag", error.tag), ("error-severity", "error"),
                               ("error-app-tag", error.app_tag)):
                if value:
                    ET.SubElement(rpc_error, NC + tag).text = value
            if error.path:
                ET.SubElement(rpc_error, NC + "error-path").text = error.path
            ET.SubElement(rpc_error, NC + "error-message",
                          {"{http://www.w3.org/XML/1998/namespace}lang": "en"}).text = error.message
            if error.info:
                info = ET.SubElement(rpc_error, NC + "error-info")
                for tag, value in error.info:
                    ET.SubElement(info, tag if tag.startswith("{") else NC + tag).text = value
        elif body is None:
            ET.SubElement(reply, NC + "ok")
        else:
            # each data subtree with its module's namespace as the default, as NETCONF servers write it
            # (`<cross-connects xmlns="http://www.polatis.com/yang/optical-switch">`), not an ns0: prefix
            ET.SubElement(reply, NC + "data")
            envelope = self._xml(reply).decode()
            subtrees = "".join(ET.tostring(top, encoding="unicode", default_namespace=OS_NS) for top in body)
            return envelope.replace("<data />", f"<data>{subtrees}</data>").encode()
        return self._xml(reply)

    # ---- the data tree (optical-switch@2018-03-22) -------------------------------------------
    def _tree(self, config_only: bool, store: str = "running") -> list[ET.Element]:
        n, m = self.bench.ocs_size
        patches, labels = self._config(store)
        tops: list[ET.Element] = []
        if not config_only:
            info = ET.Element(OS + "product-information")
            for tag, value in (("manufacturer", "Polatis"), ("serial-number", self.servers.serial),
                               ("model-name", f"EMU-{n}x{m}"), ("software-version", self.servers.version)):
                info.append(_leaf(OS + tag, value))
            tops.append(info)
        ports = ET.Element(OS + "port-config")
        for p in range(1, n + m + 1):
            port = ET.SubElement(ports, OS + "port")
            port.append(_leaf(OS + "port-id", p))
            if not config_only:
                port.append(_leaf(OS + "status", "ENABLED"))
            label, peer = labels.get(p, ("", ""))
            port.extend([_leaf(OS + "label", label), _leaf(OS + "peer-port", peer)])
        tops.append(ports)
        if not config_only:
            opm = ET.Element(OS + "opm-power")
            for p in range(1, n + m + 1):
                port = ET.SubElement(opm, OS + "port")
                port.extend([_leaf(OS + "port-id", p), _leaf(OS + "power", f"{self.bench.ocs_port_power(p):.2f}")])
            tops.append(opm)
        connections = ET.Element(OS + "cross-connects")
        for ingress, egress in sorted(patches.items()):
            pair = ET.SubElement(connections, OS + self.pair_tag)
            pair.extend([_leaf(OS + "ingress", ingress), _leaf(OS + "egress", egress)])
        tops.append(connections)
        return tops

    def _config(self, store: str) -> tuple[dict[int, int], dict[int, tuple[str, str]]]:
        """The cross-connects and port labels of `store`: running is the switch's."""
        if store == "candidate" and self._candidate is not None:
            return dict(self._candidate[0]), dict(self._candidate[1])
        return self.bench.ocs_patches(), dict(self.labels)

    def _data(self, operation: ET.Element, config_only: bool, store: str = "running") -> ET.Element:
        data = ET.Element(NC + "data")
        spec = operation.find(NC + "filter")
        tops = self._tree(config_only, store)
        if spec is None:
            data.extend(tops)
            return data
        if spec.get("type", "subtree") != "subtree":
            raise RpcError("operation-not-supported", f"filter type {spec.get('type')!r} (:xpath not offered)",
                           "protocol", info=(("bad-attribute", "type"), ("bad-element", "filter")))
        for selection in spec:
            for top in tops:
                if top.tag == selection.tag:
                    picked = subtree_filter(top, selection)
                    if picked is not None:
                        data.append(picked)
        return data

    def _datastore(self, operation: ET.Element, which: str) -> str:
        holder = operation.find(NC + which)
        store = holder[0].tag.removeprefix(NC) if holder is not None and len(holder) else ""
        if not store:
            raise RpcError("missing-element", f"<{which}> must name a datastore", "protocol",
                           info=(("bad-element", which),))
        if store not in ("running", "candidate" if self.target == "candidate" else "running"):
            raise RpcError("invalid-value", f"config not found: this switch has no {store} datastore", "protocol",
                           path=f"/nc:rpc/nc:{operation.tag.removeprefix(NC)}/nc:{which}", app_tag="data-incomplete",
                           info=((BAD_VALUE, store),))
        return store

    def _get(self, operation: ET.Element, _sid: int) -> ET.Element:
        return self._data(operation, config_only=False)

    def _get_config(self, operation: ET.Element, _sid: int) -> ET.Element:
        return self._data(operation, config_only=True, store=self._datastore(operation, "source"))

    def _lock(self, operation: ET.Element, sid: int) -> None:
        store = self._datastore(operation, "target")
        with self._state_lock:
            if self._locks.get(store, sid) != sid:
                raise RpcError("lock-denied", f"lock denied: {store} is locked by another session", "protocol",
                               app_tag="no-access", info=(("session-id", str(self._locks[store])),))
            if store == "candidate" and self._candidate is not None and store not in self._locks:
                raise RpcError("resource-denied", "candidate cannot be locked, discard-changes needed: it holds "
                               "uncommitted changes", "protocol", app_tag="no-access")
            self._locks[store] = sid

    def _unlock(self, operation: ET.Element, sid: int) -> None:
        store = self._datastore(operation, "target")
        with self._state_lock:
            if self._locks.get(store) != sid:
                raise RpcError("operation-failed", f"{store} is not locked by this session", "protocol")
            del self._locks[store]

    def _edit_config(self, operation: ET.Element, sid: int) -> None:
        store = self._datastore(operation, "target")
        if store != self.target:  # running, on a server that writes it through the candidate only (or not at all)
            raise RpcError("operation-failed", "cannot write to this configuration directly", "protocol",
                           path="/nc:rpc/nc:edit-config/nc:target", app_tag="no-access")
        with self._state_lock:
            if self._locks.get(store, sid) != sid:
                raise RpcError("in-use", f"config locked: {store} is locked by another session", path=EDIT,
                               app_tag="no-access", info=(("session-id", str(self._locks[store])),))
        default = _text(operation.find(NC + "default-operation")) or "merge"
        if default not in ("merge", "none"):
            raise RpcError("operation-not-supported", f"default-operation {default} is not supported", "protocol")
        config = operation.find(NC + "config")
        if config is None:
            raise RpcError("data-missing", "missing mandatory choice: edit-config without <config>", "protocol",
                           path="/nc:rpc/nc:edit-config", app_tag="missing-choice",
                           info=(("{urn:ietf:params:xml:ns:yang:1}missing-choice", "input"),))
        final, labels = self._config(store)
        for top in config:
            if not top.tag.startswith(OS):
                raise RpcError("unknown-namespace", f"unknown namespace: no data model for {top.tag}", "protocol",
                               app_tag="data-invalid",
                               info=(("bad-element", top.tag.rpartition("}")[2]),
                                     ("bad-namespace", top.tag[1:].partition("}")[0])))
            name = top.tag.removeprefix(OS)
            if name == "cross-connects":
                self._edit_pairs(top, final, default)
            elif name == "port-config":
                self._edit_ports(top, labels)
            elif name in ("opm-power", "product-information"):
                raise RpcError("access-denied", f"cannot write to a read-only object: {name} is state data",
                               path=f"{EDIT}/opsw:{name}", app_tag="no-access")
            else:
                raise RpcError("unknown-element", f"unknown object: {name} is not a top-level node of "
                               "optical-switch", "protocol", path=EDIT, app_tag="data-invalid",
                               info=(("bad-element", f"opsw:{name}"),))
        owners: dict[int, int] = {}
        for ingress, egress in sorted(final.items()):
            if egress in owners:
                raise RpcError("in-use", f"egress {egress} is already connected to ingress {owners[egress]}",
                               path=f"/opsw:cross-connects/opsw:pair[opsw:ingress='{ingress}']/opsw:egress",
                               info=((BAD_VALUE, str(egress)),))
            owners[egress] = ingress
        if store == "candidate":
            self._candidate = (final, labels)
        else:
            self._change(final, labels)

    def _commit(self, _operation: ET.Element, sid: int) -> None:
        with self._state_lock:
            if self._locks.get("running", sid) != sid:
                raise RpcError("in-use", "config locked: running is locked by another session", "protocol",
                               app_tag="no-access", info=(("session-id", str(self._locks["running"])),))
        if self._candidate is not None:
            self._change(*self._candidate)
        self._candidate = None

    def _discard_changes(self, _operation: ET.Element, _sid: int) -> None:
        self._candidate = None

    def _change(self, final: dict[int, int], labels: dict[int, tuple[str, str]]) -> None:
        """Make `final` the switch's cross-connects (`<ok/>` once the mirrors settle) and `labels` its labels."""
        current = self.bench.ocs_patches()
        removes = [i for i, e in current.items() if final.get(i) != e]
        adds = {i: e for i, e in final.items() if current.get(i) != e}
        if adds or removes:
            try:
                settle_ns = self.servers.apply(adds, removes)
            except OcsRefusal as exc:
                raise RpcError(_TAGS[exc.kind], exc.text) from None
            delay = (settle_ns - now_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)  # <ok/> when the mirrors have settled, as TL1 COMPLD
        if adds or removes or labels != self.labels:
            self.last_modified = _utc_now()
        self.labels = labels

    def _port(self, text: str, where: str, leaf: str) -> int:
        """`where`: the entry's path in the request (netconfd's error-path)."""
        try:
            port = int(text)
        except ValueError:
            raise RpcError("bad-element", f"invalid number: {leaf} {text!r}", "protocol", path=f"{where}/opsw:{leaf}",
                           app_tag="data-invalid", info=(("bad-element", f"opsw:{leaf}"), (BAD_VALUE, text))) from None
        n, m = self.bench.ocs_size
        valid = {"ingress": range(1, n + 1), "egress": range(n + 1, n + m + 1)}.get(leaf, range(1, n + m + 1))
        if port not in valid:
            raise RpcError("invalid-value", f"value not in range: {leaf} {text!r} is not a port of this {n}x{m} "
                           f"switch ({valid.start}..{valid.stop - 1})", "protocol", path=f"{where}/opsw:{leaf}",
                           app_tag="not-in-range", info=((BAD_VALUE, text),))
        return port

    def _edit_pairs(self, top: ET.Element, final: dict[int, int], default: str) -> None:
        container_op = _operation(top, default)
        if container_op in ("delete", "remove"):
            if container_op == "delete" and not final:
                raise RpcError("data-missing", "data missing: no cross-connects to delete",
                               path=f"{EDIT}/opsw:cross-connects", app_tag="data-incomplete")
            final.clear()
            return
        if container_op == "replace":
            final.clear()
        for pair in top:
            tag = pair.tag.removeprefix(OS)
            if tag != self.pair_tag:
                raise RpcError("unknown-element", f"unknown object: cross-connects has no {tag}", "protocol",
                               path=f"{EDIT}/opsw:cross-connects", app_tag="data-invalid",
                               info=(("bad-element", f"opsw:{tag}"),))
            if pair.find(OS + "ingress") is None:
                raise RpcError("missing-element", "pair without its key ingress", "protocol",
                               path=f"{EDIT}/opsw:cross-connects/opsw:{tag}", info=(("bad-element", "ingress"),))
            key = f"/opsw:cross-connects/opsw:{tag}[opsw:ingress='{_text(pair.find(OS + 'ingress'))}']"
            where = EDIT + key
            for leaf in pair:
                if leaf.tag not in (OS + "ingress", OS + "egress"):
                    raise RpcError("unknown-element", f"unknown object: pair has no {leaf.tag.rpartition('}')[2]}",
                                   "protocol", path=where, app_tag="data-invalid",
                                   info=(("bad-element", f"opsw:{leaf.tag.rpartition('}')[2]}"),))
            ingress = self._port(_text(pair.find(OS + "ingress")), where, "ingress")
            op = _operation(pair, "merge" if container_op == "replace" else container_op)
            egress_el = pair.find(OS + "egress")
            if op in ("delete", "remove"):
                if op == "delete" and ingress not in final:
                    raise RpcError("data-missing", f"data missing: no pair on ingress {ingress}", path=where,
                                   app_tag="data-incomplete")
                if egress_el is not None:
                    self._port(_text(egress_el), where, "egress")  # checked; the pair goes by its key, as in netconfd
                final.pop(ingress, None)
                continue
            if op not in ("merge", "create", "replace", "none"):
                raise RpcError("bad-attribute", f"invalid value: operation {op!r}", "protocol", path=where,
                               app_tag="data-invalid", info=(("bad-attribute", "operation"),
                                                             ("bad-element", f"opsw:{tag}"), (BAD_VALUE, op)))
            egress = self._port(_text(egress_el), where, "egress") if egress_el is not None else None
            if op == "create" and ingress in final:
                raise RpcError("data-exists", f"data exists: ingress {ingress} is already connected to "
                               f"{final[ingress]}", path=where, app_tag="no-access")
            if egress is None:
                if op == "none" or (op == "merge" and ingress in final):
                    continue
                # found when the edited datastore is validated: the data's path, not the request's
                raise RpcError("data-missing", "required value instance not found: pair without its mandatory "
                               "egress", path=f"{key}/opsw:egress", app_tag="instance-required",
                               info=((BAD_VALUE, "egress"),))
            final[ingress] = egress

    def _edit_ports(self, top: ET.Element, labels: dict[int, tuple[str, str]]) -> None:
        for port in top:
            where = f"{EDIT}/opsw:port-config/opsw:port[opsw:port-id='{_text(port.find(OS + 'port-id'))}']"
            if port.tag != OS + "port" or port.find(OS + "port-id") is None:
                raise RpcError("missing-element", "port-config/port needs its key port-id", "protocol", path=where,
                               info=(("bad-element", "port-id"),))
            pid = self._port(_text(port.find(OS + "port-id")), where, "port-id")
            label, peer = labels.get(pid, ("", ""))
            for leaf in port:
                name = leaf.tag.removeprefix(OS)
                if name == "status":
                    raise RpcError("access-denied", "cannot write to a read-only object: status is state data; "
                                   "use port-set-state", path=f"{where}/opsw:status", app_tag="no-access")
                if name == "label":
                    label = leaf.text or ""
                elif name == "peer-port":
                    peer = leaf.text or ""
                elif name != "port-id":
                    raise RpcError("unknown-element", f"unknown object: port has no {name}", "protocol", path=where,
                                   app_tag="data-invalid", info=(("bad-element", f"opsw:{name}"),))
            labels[pid] = (label, peer)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _SshAuth(paramiko.ServerInterface):
    def __init__(self, server: NetconfServer):
        self.server = server

    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        ok = self.server.servers.users.get(username) == password
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        if name != "netconf":
            return False
        threading.Thread(target=self.server.session, args=(channel,), daemon=True, name="netconf-session").start()
        return True


def netconf_view(servers) -> NetconfServer:
    """Registry hook (`polatis-netconf`): a running NETCONF server in front of the emulated switch."""
    return NetconfServer(servers).start()
