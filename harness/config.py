"""Inventory and playbook YAML: every error names `file:line`.

Loading rules (shared by inventories and playbooks):
- duplicate mapping keys are rejected;
- `${VAR}` / `${VAR:-default}` in string values are replaced from the environment (`$${` is a literal
  `${`); an unquoted value that is entirely templated is re-typed after substitution (`port: ${P:-22}` is
  an int); an unset variable without a default is an error;
- `include: other.yaml` (or a list) in any mapping merges the included mapping(s) first, relative to the
  including file; keys of the including mapping override (nested mappings merge recursively); include
  cycles are errors.
"""
from __future__ import annotations

import contextvars
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping

import yaml

from devices.ocs import parse_url, protocol_names
from devices.resources import Bench, HostResource, NicPort, OcsResource
from harness.errors import InputError
from pydantic import ValidationError, ValidationInfo, field_validator

from harness.specs import (AfterValidator, BaseModel, Expect, Field, Literal, Name, Port, Spec, create_model,
                           describe, errors_of, raise_all, union_of, validate)

PortItem = union_of((int, str))

DEFAULT_BENCH = "emulated:mixnet-testbed"


# --------------------------------------------------------------------------------------------- YAML
class YamlMap(dict):
    """A mapping that remembers where it and each of its keys came from."""

    file: str = "<memory>"
    line: int | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_lines: dict[Any, tuple[str, int]] = {}

    def where(self, key: Any = None) -> tuple[str, int | None]:
        if key is not None and key in self.key_lines:
            return self.key_lines[key]
        return self.file, self.line


class YamlList(list):
    """A sequence that remembers where it and each of its items came from."""

    file: str = "<memory>"
    line: int | None = None

    def __init__(self, *args):
        super().__init__(*args)
        self.item_lines: list[int] = []

    def where(self, index: int | None = None) -> tuple[str, int | None]:
        if index is not None and 0 <= index < len(self.item_lines):
            return self.file, self.item_lines[index]
        return self.file, self.line


_TEMPLATE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


def expand_env(text: str, file: str, line: int | None, env: Mapping[str, str] | None = None) -> str:
    """Replace `${VAR}` / `${VAR:-default}`; `$${` stays a literal `${`."""
    env = os.environ if env is None else env

    def replace(match: re.Match) -> str:
        token = match.group(0)
        if token == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if name is None:
            raise InputError("malformed template: expected ${NAME} or ${NAME:-default} (write $${ for a "
                             "literal ${)", file, line)
        value = env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise InputError(f"environment variable {name} is not set (use ${{{name}:-default}} for a "
                                 "default)", file, line)
            return default
        return value

    return _TEMPLATE.sub(replace, text)


# Within `load_yaml`: each templated string as substituted -> as written (LoadedYaml.templates).
_TEMPLATES: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("templates", default=None)


class _Loader(yaml.SafeLoader):
    """SafeLoader that records marks, rejects duplicate keys and expands `${VAR}`."""

    source: str = "<memory>"

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # e.g. a 5000-digit int, 2020-02-30
            raise InputError(f"invalid value: {exc}", self.source, node.start_mark.line + 1) from None

    def construct_yaml_map(self, node):
        data = YamlMap()
        data.file, data.line = self.source, node.start_mark.line + 1
        yield data
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            where = (self.source, key_node.start_mark.line + 1)
            try:
                hash(key)
            except TypeError:
                raise InputError("mapping keys must be scalars", *where) from None
            if key in data:
                first = data.key_lines[key][1]
                raise InputError(f"duplicate key {key!r} (first defined on line {first})", *where)
            data[key] = self.construct_object(value_node, deep=True)
            data.key_lines[key] = where

    def construct_yaml_seq(self, node):
        data = YamlList()
        data.file, data.line = self.source, node.start_mark.line + 1
        yield data
        for item in node.value:
            data.append(self.construct_object(item, deep=True))
            data.item_lines.append(item.start_mark.line + 1)

    def construct_yaml_str(self, node):
        value = super().construct_scalar(node)
        if "$" not in value:
            return value
        line = node.start_mark.line + 1
        expanded = expand_env(value, self.source, line)
        seen = _TEMPLATES.get()
        if seen is not None and expanded != value:
            seen[expanded] = value  # a record keeps `${NAME}`, never the value (a token, say)
        if node.style is None and expanded != value and _TEMPLATE.fullmatch(value.strip()):
            # An unquoted, wholly templated value takes the type its substitution implies.
            tag = self.resolve(yaml.ScalarNode, expanded, (True, False))
            if tag != "tag:yaml.org,2002:str":
                return self.construct_object(yaml.ScalarNode(tag, expanded, node.start_mark, node.end_mark))
        return expanded


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_yaml_seq)
_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)


def _line_of_offset(raw: bytes, offset: int) -> int:
    return raw[:offset].count(b"\n") + 1


@dataclass
class LoadedYaml:
    data: YamlMap
    files: list[Path]  # the file and every included file, in reading order
    digest: str  # sha256 over the bytes of `files`
    templates: dict[str, str] = field(default_factory=dict)  # each `${...}` string: substituted -> as written


# The largest YAML file read (playbooks and inventories are kilobytes); larger is refused before reading.
MAX_YAML_BYTES = 4 * 2**20


def _read_regular(path: Path, shown: str) -> bytes:
    """A regular file's bytes, at most MAX_YAML_BYTES: /dev/zero or a FIFO is refused before it is read
    (one would never end, the other blocks), as is a file too large to be a playbook."""
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NONBLOCK)) as f:
        info = os.fstat(f.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            raise InputError("not a regular file (a device, FIFO or socket is never read as YAML)", shown)
        raw = f.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise InputError(f"larger than {MAX_YAML_BYTES} bytes: not a playbook, inventory or profile", shown)
    return raw


def _parse(path: Path, shown: str) -> tuple[Any, bytes]:
    try:
        raw = _read_regular(path, shown)
    except FileNotFoundError:
        raise InputError("file not found", shown) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a YAML file", shown) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", shown) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); expected a YAML file", shown,
                         _line_of_offset(raw, exc.start)) from None
    loader = None
    try:
        loader = _Loader(text)
        loader.source = shown
        return loader.get_single_data(), raw
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        msg = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise InputError(f"invalid YAML: {msg}", shown, mark.line + 1 if mark else None) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise InputError(f"invalid YAML: unacceptable character #x{exc.character:04x}", shown, line) from None
    except yaml.YAMLError as exc:  # unmarked errors concern the document, which starts on line 1
        raise InputError(f"invalid YAML: {exc}", shown, 1) from None
    except RecursionError:
        raise InputError("invalid YAML: nesting too deep", shown, 1) from None
    finally:
        if loader is not None:
            loader.dispose()


def _merge(base: YamlMap, over: YamlMap) -> YamlMap:
    out = YamlMap(base)
    out.file, out.line = over.file, over.line
    out.key_lines = dict(base.key_lines)
    for key, value in over.items():
        if isinstance(value, YamlMap) and isinstance(out.get(key), YamlMap):
            value = _merge(out[key], value)
        out[key] = value
        out.key_lines[key] = over.key_lines.get(key, (over.file, over.line))
    return out


MAX_YAML_NODES = 100_000  # values after aliases are expanded; a real inventory or playbook has hundreds


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    """How many values `node` stands for once every alias is expanded (each shared node counted once,
    so an anchor bomb costs its size in the file, not in the expansion)."""
    if not isinstance(node, (list, dict)):
        return 1
    if id(node) not in memo:
        memo[id(node)] = 0  # a (recursive) alias back into itself counts as one value
        children = node.values() if isinstance(node, dict) else node
        memo[id(node)] = min(1 + sum(_expanded_size(c, memo) for c in children), MAX_YAML_NODES + 1)
    return memo[id(node)]


def _resolve_includes(node: Any, path: Path, stack: tuple[Path, ...], files: list[Path],
                      seen: dict[int, Any] | None = None) -> Any:
    """Replace every `include:` mapping by the merge. A node reached again through an alias is resolved
    once (`seen`): aliases are never walked twice."""
    seen = {} if seen is None else seen
    if id(node) in seen:
        return seen[id(node)]
    if isinstance(node, YamlList):
        seen[id(node)] = node
        for i, item in enumerate(node):
            node[i] = _resolve_includes(item, path, stack, files, seen)
        return node
    if not isinstance(node, YamlMap):
        return node
    seen[id(node)] = node
    for key in list(node):
        if key != "include":
            node[key] = _resolve_includes(node[key], path, stack, files, seen)
    if "include" not in node:
        return node
    names = node["include"]
    file, line = node.where("include")
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise InputError("include: expected a file name or a list of file names", file, line)
    merged = YamlMap()
    merged.file, merged.line = node.file, node.line
    for name in names:
        try:
            target = (path.parent / os.path.expanduser(name)).resolve()
        except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, symlink loops
            raise InputError(f"include: bad file name {name!r}: {exc}", file, line) from None
        if target in stack:
            chain = " -> ".join(p.name for p in (*stack[stack.index(target):], target))
            raise InputError(f"include cycle: {chain}", file, line)
        if not target.is_file():
            raise InputError(f"included file {name!r} not found (looked for {str(target)!r})", file, line)
        included = _load_file(target, stack, files)
        if not isinstance(included, YamlMap):
            raise InputError(f"included file {name!r} must contain a mapping", file, line)
        merged = _merge(merged, included)
    own = YamlMap({k: v for k, v in node.items() if k != "include"})
    own.file, own.line = node.file, node.line
    own.key_lines = {k: v for k, v in node.key_lines.items() if k != "include"}
    seen[id(node)] = result = _merge(merged, own)
    return result


def _load_file(path: Path, stack: tuple[Path, ...], files: list[Path]) -> Any:
    data, _raw = _parse(path, str(path))
    files.append(path)
    if _expanded_size(data, {}) > MAX_YAML_NODES:
        raise InputError(f"expands to more than {MAX_YAML_NODES} values through YAML aliases (an anchor bomb?)",
                         str(path), 1)
    return _resolve_includes(data, path, (*stack, path.resolve()), files)


def load_yaml(path: str | os.PathLike) -> LoadedYaml:
    """Load a YAML mapping with marks, duplicate-key checks, env templating and includes."""
    path = Path(path)
    files: list[Path] = []
    templates: dict[str, str] = {}
    token = _TEMPLATES.set(templates)
    try:
        data = _load_file(path, (), files)
    finally:
        _TEMPLATES.reset(token)
    if not isinstance(data, YamlMap):
        kind = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(f"expected a YAML mapping at the top level, found {kind}", str(path),
                         getattr(data, "line", 1))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return LoadedYaml(data, files, digest.hexdigest(), templates)


# ------------------------------------------------------------------------------------ schema checks
def check_mapping(node: Any, model: type[Spec], what: str, where: tuple[str, int | None]) -> dict:
    """Validate `node` against a declared spec; return a plain dict with defaults filled. Every problem is
    reported at once."""
    if not isinstance(node, dict):
        raise InputError(f"{what}: expected a mapping, found {describe(node)}", *where)
    return params_of(validate(model, node, what, where), node)


def params_of(spec: Spec, node: Mapping) -> dict:
    """A validated spec as the plain dict steps read; lists and mappings stay the loaded YAML nodes
    (which remember their lines)."""
    out = {}
    for key in type(spec).model_fields:
        value = getattr(spec, key)
        if isinstance(value, BaseModel):
            value = value.model_dump()
        elif key in node and isinstance(value, (list, dict)):
            value = node[key]
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------- inventory
class BenchSpec(Spec):
    name: str
    emulated: bool = False
    host_workers: int = Field(
        0, ge=0, description="emulated bench: its hosts are served by this many worker processes (harness emulate "
                       "--workers N); state that lives in the bench's own process is not theirs")
    strict_host_keys: bool | None = Field(
        None, description="check every host's key against its known_hosts and refuse unknown ones; default: true "
                          "on a real bench, false on an emulated one (unknown keys are learned privately)")


Jumps = union_of((str, list))


class OcsSpec(Spec):
    protocol: str = Field(description="a protocol of the OCS registry (devices/ocs/registry.py), e.g. polatis-tl1")
    url: str = Field(description="a URL form the protocol accepts (tcp://H:P, ssh://H:830, a serial device, ...)")
    size: Annotated[list[Annotated[int, Field(ge=1, le=4096)]],
                    Field(min_length=2, max_length=2, description="[ingress_count, egress_count] (integers 1..4096)")]
    allowed_ports: Annotated[list[PortItem], Field(description='port numbers or ranges "a-b"')]
    user: str | None = None
    password_env: str | None = Field(None, description="the environment variable holding the password")
    passphrase_env: str | None = Field(None, description="ssh:// only: the environment variable holding the "
                                                         "passphrase of the URL's identity_file")
    proxy_jump: Jumps | None = Field(None, description="ssh:// only: SSH jump hosts in order, '[user@]host[:port]': "
                                                       "'a,b' or a list (each checked against the URL's known_hosts)")
    baudrate: Annotated[int, Field(ge=1, le=10_000_000, description="1..10000000")] = 38400
    plan_from_confirmed_read: bool | None = Field(
        None, description="plan each change from the driver's own last confirming read, without a read round "
                          "trip (docs/ocs.md); default: true on an emulated bench, false on a real one, where a "
                          "patch re-made behind the harness's back to a port outside allowed_ports would be removed")

    @field_validator("protocol")
    @classmethod
    def _registered(cls, protocol: str) -> str:
        if protocol not in protocol_names():  # read at validation time: a lab may register its own
            raise ValueError(f"expected one of {', '.join(protocol_names())}, found {protocol!r}")
        return protocol

    @field_validator("url")
    @classmethod
    def _reachable_form(cls, url: str, info: ValidationInfo) -> str:
        if "protocol" in info.data:  # the URL forms that protocol's registry entry accepts
            parse_url(url, info.data["protocol"])
        return url


class NicSpec(Spec):
    netdev: str
    rdma_dev: str
    rdma_port: Annotated[int, Field(ge=1, le=255, description="1..255")] = 1
    ocs: str
    tx: int = Field(description="the switch's ingress port this NIC transmits into")
    rx: int = Field(description="the switch's egress port this NIC receives from")
    gbps: Annotated[float, Field(gt=0)] | None = Field(None, description="the port's physical rate (line rate)")


def _absolute_paths(tools: dict[str, str] | None) -> dict[str, str] | None:
    for name, path in (tools or {}).items():
        if not path.startswith("/"):
            raise ValueError(f"tools.{name}: expected an absolute path, found {path!r}")
    return tools



class HostAccessSpec(Spec):
    """How a host is reached and what it may run: per host, or for every host as `host_defaults`. A value given
    in the inventory wins over ssh_config's."""

    user: str | None = Field(None, description="login user (default: ssh_config's User, else root)")
    identity_file: str | None = Field(None, description="the pinned private key (tried before the ssh-agent's)")
    passphrase_env: str | None = Field(None, description="the environment variable holding identity_file's passphrase")
    known_hosts: str | None = Field(None, description="known_hosts for the host and its jump hosts (default: "
                                                      "ssh_config's UserKnownHostsFile, else ~/.ssh/known_hosts)")
    ssh_config: str | None = Field(None, description="the ssh_config file read for the host and its jump hosts "
                                                     "(default: ~/.ssh/config on a real bench; 'none': no file)")
    proxy_jump: Jumps | None = Field(None, description="jump hosts in order, '[user@]host[:port]' or ssh_config "
                                                       "aliases: 'a,b' or a list; 'none': direct")
    become: Literal["sudo"] | None = Field(None, description="sudo: the agent and privileged tools run under "
                                                             "`sudo -n` (never a password prompt)")
    tools: Annotated[dict[str, str] | None, AfterValidator(_absolute_paths),
                     Field(description="tool name -> absolute path run instead of the bare name "
                                       "(ethtool, ip, rdma, mlxlink, nvidia-smi)")] = None


class HostSpec(HostAccessSpec):
    address: str | None = Field(None, description="the address or ssh_config alias (default: the host's name)")
    port: Port | None = Field(None, description="default: ssh_config's Port, else 22")
    proxy_command: str | None = Field(None, description="OpenSSH ProxyCommand (%h, %p, %r expanded)")
    python: str = "python3"
    nics: list[NicSpec] = []


IMPORTS_HELP = ("plugin modules (names, or .py files relative to this file) imported before the rest is "
                "checked: they register their step types and switch protocols (devices/plugins.py)")


def import_plugins(data: Any, source: str) -> tuple[str, ...]:
    """The modules an inventory or playbook names under `imports:`, imported before the rest of it is checked:
    they may register the step types and switch protocols it uses. Returns them as imported (a file by its
    absolute path: what a copy of the playbook, as a resumed run reads it, must name)."""
    from devices.plugins import PluginError, import_module

    node = data.get("imports") if isinstance(data, dict) else None
    if not node:
        return ()
    where = data.where("imports") if isinstance(data, YamlMap) else (source, None)
    if not isinstance(node, list) or not all(isinstance(name, str) and name for name in node):
        raise InputError("imports: expected a list of module names or .py files", *where)
    base = Path(source).resolve().parent if source and not source.startswith("<") else None
    for i, name in enumerate(node):
        try:
            import_module(name, base)
        except PluginError as exc:
            raise InputError(f"imports[{i}]: {exc}", *(node.where(i) if isinstance(node, YamlList) else where)) \
                from None
    return tuple(str((base or Path()) / Path(name).expanduser()) if name.endswith(".py") else name for name in node)


class InventorySpec(Spec):
    """A bench inventory (ARCHITECTURE.md): the switches, the hosts and the NIC ports cabled to them."""

    bench: BenchSpec
    ocs: Annotated[dict[str, OcsSpec], Field(min_length=1, description="at least one switch")]
    host_defaults: HostAccessSpec | None = None
    hosts: dict[str, HostSpec]
    imports: list[str] = Field([], description=IMPORTS_HELP)


_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_port_list(items: list, size_total: int, what: str, where_item: Callable[[int], tuple]) -> frozenset[int]:
    """`[1, 3, "5-8"]` -> {1, 3, 5, 6, 7, 8}; every port within 1..size_total."""
    ports: set[int] = set()
    for i, item in enumerate(items):
        if isinstance(item, int) and not isinstance(item, bool):
            low = high = item
        elif isinstance(item, str) and (m := _RANGE.match(item)):
            low, high = int(m.group(1)), int(m.group(2))
            if low > high:
                raise InputError(f"{what}: range {item!r} is empty (low > high)", *where_item(i))
        elif isinstance(item, str) and item.strip().isdigit():
            low = high = int(item)
        else:
            raise InputError(f"{what}: expected a port number or a range \"a-b\", found {item!r}", *where_item(i))
        if low < 1 or high > size_total:
            raise InputError(f"{what}: port(s) {item!r} outside 1..{size_total}", *where_item(i))
        ports.update(range(low, high + 1))
    return frozenset(ports)


def _name_ok(name: Any) -> bool:
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_.\-]+", name) is not None


def _check_name(name: Any, what: str, where: tuple) -> str:
    if not _name_ok(name):
        raise InputError(f"{what}: name {name!r} must be letters, digits, '_', '.', '-'", *where)
    return name


def _plan_from_confirmed_read(spec: OcsSpec, inv: InventorySpec | None) -> bool:
    """The switch's own setting, else on only where nobody else can touch it: an emulated bench."""
    if spec.plan_from_confirmed_read is not None:
        return spec.plan_from_confirmed_read
    return inv is not None and inv.bench.emulated


def _ocs_route(name: str, spec: OcsSpec, node: YamlMap, env: Mapping[str, str], secrets: bool,
               problems: list) -> tuple[tuple, str | None]:
    """An ssh:// switch's jump hosts (each hop: the switch's user, the URL's identity_file and known_hosts unless
    it names its own user) and its key's passphrase, read from the environment."""
    from devices.ssh import parse_jump

    jumps = spec.proxy_jump
    if isinstance(jumps, str):
        jumps = [] if jumps.strip() == "none" else [j for j in jumps.split(",") if j.strip()]
    if not (jumps or spec.passphrase_env):
        return (), None
    endpoint = parse_url(spec.url, spec.protocol)  # valid: OcsSpec checked it
    if endpoint.kind != "ssh":
        key = "proxy_jump" if jumps else "passphrase_env"
        problems.append(InputError(f"ocs.{name}.{key}: only for an ssh:// switch URL, found {spec.url!r}",
                                   *node.where(key)))
        return (), None
    hops = []
    for hop in jumps or []:
        try:
            hops.append(parse_jump(str(hop), config=None, user=spec.user or "root",
                                   identity_file=endpoint.option("identity_file"),
                                   known_hosts=endpoint.option("known_hosts")))
        except ValueError as exc:
            problems.append(InputError(f"ocs.{name}.proxy_jump: {exc}", *node.where("proxy_jump")))
    passphrase = env.get(spec.passphrase_env) if spec.passphrase_env else None
    if spec.passphrase_env and passphrase is None and secrets:
        problems.append(InputError(f"ocs.{name}.passphrase_env: environment variable {spec.passphrase_env} is not set",
                                   *node.where("passphrase_env")))
    return tuple(hops), passphrase


def _valid(model: type[Spec], node: Any) -> Spec | None:
    try:
        return model.model_validate(node)
    except ValidationError:
        return None


def bench_from_data(data: YamlMap, source: str, env: Mapping[str, str] | None = None, *,
                    secrets: bool = True) -> Bench:
    """Build a Bench from an already loaded inventory mapping. Every problem of the file is reported at once:
    what InventorySpec declares, and the cabling rules over every switch and NIC that is sound on its own
    (a bad key of one host does not hide a port another NIC reuses). `secrets=False`: a secret's variable
    may be unset (a lint without the lab's secrets: `harness validate` without --connect)."""
    env = os.environ if env is None else env
    if not isinstance(data, dict):
        raise InputError(f"inventory: expected a mapping, found {describe(data)}", data.file, data.line)
    import_plugins(data, source)
    for where, node, what in _password_places(data):
        raise InputError(f"{what}passwords never go in files: set an environment variable and name it with "
                         "password_env", *where)
    problems: list[InputError] = []
    try:
        inv = InventorySpec.model_validate(data)
    except ValidationError as exc:
        problems += errors_of(exc, InventorySpec, data, "", (data.file, data.line))
        inv = None

    def bad(message: str, where: tuple) -> None:
        problems.append(InputError(message, *where))

    def parts(key: str) -> dict:
        node = data.get(key)
        return node if isinstance(node, YamlMap) else YamlMap()

    switches: dict[str, OcsResource] = {}
    for name, node in parts("ocs").items():
        where = data["ocs"].where(name)
        if not _name_ok(name):
            bad(f"ocs: name {name!r} must be letters, digits, '_', '.', '-'", where)
        spec = _valid(OcsSpec, node)
        if spec is None:
            continue
        allowed_node = node["allowed_ports"]
        try:
            allowed = parse_port_list(allowed_node, sum(spec.size), f"ocs.{name}.allowed_ports",
                                      lambda i, n=allowed_node: n.where(i) if isinstance(n, YamlList) else where)
        except InputError as exc:
            problems.append(exc)
            continue
        password = None
        if spec.password_env:
            password = env.get(spec.password_env)
            if password is None and secrets:
                bad(f"ocs.{name}.password_env: environment variable {spec.password_env} is not set",
                    node.where("password_env"))
        hops, passphrase = _ocs_route(name, spec, node, env, secrets, problems)
        switches[name] = OcsResource(name=name, protocol=spec.protocol, url=spec.url, size=tuple(spec.size),
                                     allowed_ports=allowed, user=spec.user, password=password,
                                     proxy_jump=hops, passphrase=passphrase,
                                     baudrate=spec.baudrate,
                                     plan_from_confirmed_read=_plan_from_confirmed_read(spec, inv))

    nic_ports: list[NicPort] = []
    used_ocs_ports: dict[tuple[str, int], str] = {}
    for name, node in parts("hosts").items():
        if not _name_ok(name):
            bad(f"hosts: name {name!r} must be letters, digits, '_', '.', '-'", data["hosts"].where(name))
        nics = node.get("nics") if isinstance(node, dict) else None
        netdevs: set[str] = set()
        for i, nic_node in enumerate(nics if isinstance(nics, list) else []):
            nic = _valid(NicSpec, nic_node)
            if nic is None:
                continue
            kw = nic_node.where
            what = f"hosts.{name}.nics[{i}]"
            if nic.netdev in netdevs:
                bad(f"{what}: netdev {nic.netdev!r} appears twice on host {name}", kw("netdev"))
            netdevs.add(nic.netdev)
            switch = switches.get(nic.ocs)
            if switch is None:
                if nic.ocs not in parts("ocs"):  # a known switch with its own error needs no second one here
                    bad(f"{what}.ocs: no switch named {nic.ocs!r} (known: {', '.join(map(str, parts('ocs')))})", kw("ocs"))
                continue
            n_in, n_out = switch.size
            checks = (("tx", 1, n_in, "an ingress port"), ("rx", n_in + 1, n_in + n_out, "an egress port"))
            for key, low, high, kind in checks:
                port = getattr(nic, key)
                if not low <= port <= high:
                    bad(f"{what}.{key}: {port} is not {kind} of {switch.name} ({low}..{high})", kw(key))
                elif port not in switch.allowed_ports:
                    bad(f"{what}.{key}: port {port} is not in {switch.name}.allowed_ports", kw(key))
                elif owner := used_ocs_ports.get((switch.name, port)):
                    bad(f"{what}.{key}: {switch.name} port {port} is already used by {owner}", kw(key))
                else:
                    used_ocs_ports[(switch.name, port)] = f"{name}:{nic.netdev}"
            nic_ports.append(NicPort(host=name, netdev=nic.netdev, rdma_dev=nic.rdma_dev, rdma_port=nic.rdma_port,
                                     ocs=switch.name, ocs_tx=nic.tx, ocs_rx=nic.rx, gbps=nic.gbps))
    hosts = {}
    if inv is not None:
        for name, spec in inv.hosts.items():
            try:
                hosts[name] = host_resource(name, spec, inv.host_defaults, inv.bench.emulated, env,
                                            data["hosts"][name], data.get("host_defaults"),
                                            strict=inv.bench.strict_host_keys)
            except InputError as exc:
                problems.append(exc)
    raise_all(problems)
    return Bench(name=inv.bench.name, emulated=inv.bench.emulated, ocs=switches, hosts=hosts,
                 nic_ports=tuple(nic_ports), source=source, host_workers=inv.bench.host_workers)


SSH_CONFIG = "~/.ssh/config"


def host_resource(name: str, spec: HostSpec, defaults: HostAccessSpec | None, emulated: bool,
                  env: Mapping[str, str], node: YamlMap, defaults_node: YamlMap | None,
                  strict: bool | None = None) -> HostResource:
    """One host as the harness reaches it: its own fields, else `host_defaults`, else ssh_config's (Host/Match
    on its address or name: HostName, User, Port, IdentityFile, UserKnownHostsFile, ProxyJump, ProxyCommand),
    else the built-in defaults. ssh_config is read from the named file, else ~/.ssh/config where it exists on a
    real bench (an emulated one is on loopback: a personal ssh_config has nothing to say about it)."""
    from devices.resources import KNOWN_TOOLS
    from devices.ssh import parse_jump, ssh_config_for

    def given(key: str):
        """(value, where) from the host, else host_defaults; (None, host) when neither names it."""
        value = getattr(spec, key)
        if value is not None:
            return value, node.where(key)
        value = getattr(defaults, key) if defaults is not None else None
        if value is not None:
            return value, defaults_node.where(key)
        return None, node.where()

    config_path, config_where = given("ssh_config")
    if config_path is None and not emulated and os.path.exists(os.path.expanduser(SSH_CONFIG)):
        config_path = SSH_CONFIG
    if config_path == "none":
        config_path = None
    alias = spec.address or name
    try:
        found = ssh_config_for(alias, config_path) if config_path else {}
    except OSError as exc:
        raise InputError(f"hosts.{name}: ssh_config {config_path}: {exc.strerror or exc}", *config_where) from None
    except paramiko_errors() as exc:
        raise InputError(f"hosts.{name}: ssh_config {config_path}: {exc}", *config_where) from None
    user = given("user")[0] or found.get("user") or "root"
    identity_file = given("identity_file")[0] or next(iter(found.get("identityfile") or []), None)
    known_hosts = given("known_hosts")[0] or (found.get("userknownhostsfile") or "").split(" ")[0] or None
    try:
        port = spec.port or int(found.get("port", 22))
    except ValueError:
        raise InputError(f"hosts.{name}: ssh_config {config_path}: Port {found.get('port')!r} is not a number",
                         *config_where) from None
    jumps, jumps_where = given("proxy_jump")
    if jumps is None:
        jumps, jumps_where = found.get("proxyjump"), config_where
    if isinstance(jumps, str):
        jumps = [] if jumps.strip() == "none" else [j for j in jumps.split(",") if j.strip()]
    proxy_command = spec.proxy_command or (None if jumps else found.get("proxycommand"))
    if jumps and spec.proxy_command:
        raise InputError(f"hosts.{name}: proxy_jump and proxy_command exclude each other", *node.where("proxy_command"))
    hops = []
    for hop in jumps or []:
        try:
            hops.append(parse_jump(str(hop), config=config_path, user=user, identity_file=identity_file,
                                   known_hosts=known_hosts))
        except (ValueError, OSError) as exc:
            raise InputError(f"hosts.{name}.proxy_jump: {exc}", *jumps_where) from None
    passphrase = None
    passphrase_env, passphrase_where = given("passphrase_env")
    if passphrase_env:
        passphrase = env.get(passphrase_env)
        if passphrase is None:
            raise InputError(f"hosts.{name}.passphrase_env: environment variable {passphrase_env} is not set",
                             *passphrase_where)
    tools, tools_where = given("tools")
    unknown = sorted(set(tools or {}) - set(KNOWN_TOOLS))
    if unknown:
        raise InputError(f"hosts.{name}.tools: {', '.join(unknown)}: expected tools among {', '.join(KNOWN_TOOLS)}",
                         *tools_where)
    return HostResource(name=name, address=found.get("hostname", alias), port=port, user=user,
                        identity_file=identity_file, known_hosts=known_hosts,
                        strict_host_key=not emulated if strict is None else strict,
                        python=spec.python, proxy_jump=tuple(hops), proxy_command=proxy_command,
                        passphrase=passphrase, become=given("become")[0], tools=tuple(sorted((tools or {}).items())))


def paramiko_errors() -> tuple[type[Exception], ...]:
    import paramiko

    return (paramiko.ssh_exception.ConfigParseError, paramiko.SSHException)


def _password_places(data: YamlMap):
    """Where an inventory holds a `password:` key (refused before anything else is read)."""
    if "password" in data:
        yield data.where("password"), data, ""
    ocs = data.get("ocs")
    if isinstance(ocs, dict):
        for name, node in ocs.items():
            if isinstance(node, dict) and "password" in node:
                yield node.where("password"), node, f"ocs.{name}.password: "


def load_inventory(path: str | os.PathLike) -> Bench:
    """Read and validate a bench inventory (ARCHITECTURE.md). Passwords come only from `password_env`."""
    loaded = load_yaml(path)
    return bench_from_data(loaded.data, str(path))


# ----------------------------------------------------------------------------------------- playbook
@dataclass(frozen=True)
class StepType:
    name: str
    model: type[Spec]  # the step's parameters
    impl: Any = None
    # resume_point(run_dir, step, last_logged_cycle) -> cycles already done; None: the step reruns whole
    resume_point: Any = None


class RegistrationError(TypeError):
    """A step type registered twice (two modules would silently fight over one name)."""


STEP_TYPES: dict[str, StepType] = {}
# Extra top-level playbook keys a lab (or the runner) may declare: Spec classes, each field a key.
PLAYBOOK_OPTIONS: list[type[Spec]] = []


def _model_name(type_name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", type_name)) + "Params"


def register_step(type_name: str, params: type[Spec] | None = None, registry: dict[str, StepType] | None = None,
                  *, resume_point=None):
    """Declare a step type and its parameters: a Spec class (each field's type, default and range once; the
    JSON Schema follows from it); None: the step takes none.

    Registers at once; the returned decorator attaches the implementation:
    `@register_step("soak", SoakParams)` above a function or class. A name already registered is refused
    (RegistrationError). `resume_point`: see StepType.
    """
    registry = STEP_TYPES if registry is None else registry
    if type_name in registry:
        raise RegistrationError(f"step type {type_name!r} is already registered")
    if params is None:
        params = create_model(_model_name(type_name), __base__=Spec)
    if not (isinstance(params, type) and issubclass(params, Spec)):
        raise TypeError(f"step {type_name}: parameters must be a Spec class (harness.specs), found {params!r}")
    reserved = {"type", "name"} & set(params.model_fields)
    if reserved:
        raise TypeError(f"step {type_name}: {', '.join(sorted(reserved))} are reserved step keys")
    registry[type_name] = StepType(type_name, params, resume_point=resume_point)

    def attach(impl):
        if registry[type_name].impl is not None:
            raise RegistrationError(f"step type {type_name!r} already has an implementation")
        registry[type_name] = StepType(type_name, params, impl, resume_point)
        return impl

    return attach


# A step name becomes part of file names in the run directory (`replay_NAME.parquet`): letters, digits, `_`
# and `-` only, so it can neither leave the directory (`/`, `..`) nor meet another step's file (`srv.a` and
# `srv.b` would both end in `replay_srv.*`).
STEP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
STEP_NAME_RULE = "a letter, then up to 63 letters, digits, '_' or '-'"


@dataclass(frozen=True)
class Step:
    type: str
    name: str
    params: dict
    line: int | None
    file: str = ""

    def __post_init__(self):
        if not (isinstance(self.name, str) and STEP_NAME.fullmatch(self.name)):
            raise ValueError(f"step name {self.name!r}: expected {STEP_NAME_RULE}")

    def resolve_path(self, value: str) -> Path:
        """A file a step names: `~` expanded, a relative path taken from the playbook's folder (not the
        current directory), so a playbook runs the same from anywhere."""
        path = Path(value).expanduser()
        if not path.is_absolute() and self.file and not self.file.startswith("<"):
            path = Path(self.file).resolve().parent / path
        return path


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    bench: str
    seed: int
    cycles: int
    steps: list[Step]
    source: str
    sha256: str
    options: dict = field(default_factory=dict)
    sweep: dict | None = None  # a validated `sweep:` block (harness.sweep), run by `harness sweep`
    imports: tuple[str, ...] = ()  # plugin modules it imported (import_plugins)
    templates: dict = field(default_factory=dict)  # substituted -> as written (`${NAME}`): what records keep


def _distinct(what: str) -> AfterValidator:
    def check(values: list) -> list:
        if len({repr(v) for v in values}) != len(values):
            raise ValueError(f"a {what} is listed twice")
        return values

    return AfterValidator(check)


Seed = Annotated[int, Field(ge=0, lt=2**63), Expect("an integer 0..2**63-1")]
MAX_CYCLES = 10_000_000  # a playbook's and `--cycles`' bound


class SweepSpec(Spec):
    """A sweep (harness sweep): every combination of the grid's values, each run once per seed. A grid key is
    STEP.PARAM (a step's parameter, dotted into mappings), profile.FIELD (the emulated bench's profile) or
    `cycles`; which of them a playbook may name is checked against its steps (harness.config.check_sweep)."""

    grid: Annotated[dict[str, Annotated[list, Field(min_length=1), _distinct("value"),
                                        Expect("a non-empty list of values")]],
                    Field(min_length=1), Expect("at least one parameter")]
    seeds: Annotated[list[Seed], _distinct("seed")] = Field([], description="empty: the playbook's seed")


SWEEP_TOP_LEVEL = ("cycles",)  # the playbook's own keys a sweep grid may name


def check_sweep(node: Any, steps: list, step_types: dict, where: tuple) -> dict:
    """A playbook's `sweep:` block (its shape already validated: SweepSpec) against its steps:
    every problem at its file:line at once. A plain dict back: {"grid": {key: [values]}, "seeds": [int]}.
    Profile fields are checked when the bench is known."""
    grid_node = node["grid"]
    by_name = {s.name: s for s in steps}
    problems: list[InputError] = []
    for key, values in grid_node.items():
        at = grid_node.where(key) if hasattr(grid_node, "where") else where
        head, _, rest = str(key).partition(".")
        if key in SWEEP_TOP_LEVEL:
            problems += [InputError(f"sweep.grid.{key}[{i}]: expected a positive integer", *_item(values, i, at))
                         for i, v in enumerate(values) if type(v) is not int or v < 1]
        elif head == "profile":
            if not rest:
                problems.append(InputError("sweep.grid.profile: name a profile field, e.g. profile.ocs.switch.ms", *at))
        elif head in by_name and rest:
            step = by_name[head]
            param = rest.split(".")[0]
            model = step_types[step.type].model
            if param not in model.model_fields:
                problems.append(InputError(f"sweep.grid.{key}: step {head!r} ({step.type}) has no parameter "
                                           f"{param!r} (known: {', '.join(model.model_fields) or 'none'})", *at))
                continue
            for i, v in enumerate(values):  # the step's own validation, on the overridden parameters
                try:
                    check_mapping(override(step.params, rest, v), model, f"sweep.grid value {i + 1} for step "
                                  f"{head!r}", at)
                except InputError as exc:
                    problems += [InputError(e.message, *_item(values, i, at)) for e in getattr(exc, "errors", [exc])]
        else:
            problems.append(InputError(f"sweep.grid.{key}: expected STEP.PARAM (steps: {', '.join(by_name)}), "
                                       f"profile.FIELD or {', '.join(SWEEP_TOP_LEVEL)}", *at))
    raise_all(problems)
    return {"grid": {str(k): list(v) for k, v in grid_node.items()}, "seeds": list(node.get("seeds", []))}


def _item(values, i: int, fallback: tuple) -> tuple:
    return values.where(i) if isinstance(values, YamlList) else fallback


def override(mapping: dict, dotted: str, value: Any) -> dict:
    """A copy of `mapping` with the value at `a.b.c` replaced (intermediate mappings created)."""
    head, _, rest = dotted.partition(".")
    out = dict(mapping)
    out[head] = override(out.get(head) if isinstance(out.get(head), dict) else {}, rest, value) if rest else value
    return out


class PlaybookSpec(Spec):
    """A playbook: the steps a run takes, in order (each step's own keys: its type's parameters)."""

    name: Name
    description: str = ""
    bench: str = Field(DEFAULT_BENCH, description="emulated:PROFILE or an inventory file")
    seed: Annotated[int, Field(ge=0, lt=2**63, description="0..2**63-1")] = 0
    cycles: Annotated[int, Field(ge=1, le=MAX_CYCLES, description=f"1..{MAX_CYCLES}")] = 1
    steps: list
    sweep: SweepSpec | None = None
    imports: list[str] = Field([], description=IMPORTS_HELP)


def playbook_model() -> type[Spec]:
    """PlaybookSpec with the extra top-level keys labs declared in PLAYBOOK_OPTIONS."""
    return create_model("Playbook", __base__=(PlaybookSpec, *PLAYBOOK_OPTIONS)) if PLAYBOOK_OPTIONS else PlaybookSpec


def discover_steps() -> dict[str, StepType]:
    """Import every module under harness/steps/ so their @register_step decorators run."""
    import importlib
    import pkgutil

    try:
        import harness.steps as steps_pkg
    except ImportError:
        return STEP_TYPES
    for info in pkgutil.iter_modules(getattr(steps_pkg, "__path__", [])):
        importlib.import_module(f"harness.steps.{info.name}")
    from devices.plugins import GROUPS, PluginError, load_group

    try:  # a lab's installed step plugins (entry points `ocs_hil.steps`)
        load_group(GROUPS["steps"])
    except PluginError as exc:
        raise InputError(str(exc)) from None
    return STEP_TYPES


def playbook_from_data(loaded: LoadedYaml, source: str, step_types: Mapping[str, StepType]) -> Playbook:
    data = loaded.data
    imports = import_plugins(data, source)  # registers into STEP_TYPES: `step_types` unless a test gave its own
    problems: list[InputError] = []
    try:  # the top-level keys and every step are checked in one pass
        top = check_mapping(data, playbook_model(), "playbook", (data.file, data.line))
    except InputError as exc:
        problems.extend(getattr(exc, "errors", [exc]))
        top = None
    steps_node = data.get("steps") if isinstance(data, dict) else None
    steps: list[Step] = []
    names: dict[str, int | None] = {}
    for i, node in enumerate(steps_node if isinstance(steps_node, list) else []):
        try:
            step = _step_from_node(i, node, steps_node, data, step_types, names)
        except InputError as exc:
            problems.extend(getattr(exc, "errors", [exc]))
        else:
            steps.append(step)
    raise_all(problems)
    if not steps:
        raise InputError("playbook.steps: expected at least one step", *data.where("steps"))
    options = {k: top[k] for spec in PLAYBOOK_OPTIONS for k in spec.model_fields}
    sweep = None
    if top["sweep"] is not None:
        sweep = check_sweep(data["sweep"], steps, step_types, data.where("sweep"))
    return Playbook(name=top["name"], description=top["description"], bench=top["bench"], seed=top["seed"],
                    cycles=top["cycles"], steps=steps, source=source, sha256=loaded.digest, options=options,
                    sweep=sweep, imports=imports, templates=loaded.templates)


def _step_from_node(i: int, node: Any, steps_node: Any, data: YamlMap, step_types: Mapping[str, StepType],
                    names: dict[str, int | None]) -> Step:
    where = steps_node.where(i) if isinstance(steps_node, YamlList) else (data.file, data.line)
    if not isinstance(node, dict):
        raise InputError(f"steps[{i}]: expected a mapping with a 'type', found {describe(node)}", *where)
    kw = node.where if isinstance(node, YamlMap) else (lambda k=None: where)
    step_type = node.get("type")
    if not isinstance(step_type, str):
        raise InputError(f"steps[{i}]: missing 'type' (a string; known: {', '.join(sorted(step_types)) or 'none'})",
                         *kw("type"))
    spec = step_types.get(step_type)
    if spec is None:
        raise InputError(f"steps[{i}]: unknown step type {step_type!r} (known: "
                         f"{', '.join(sorted(step_types)) or 'none registered'})", *kw("type"))
    name = node.get("name", f"{step_type}-{i + 1}")
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
        raise InputError(f"steps[{i}].name: expected {STEP_NAME_RULE}, found {describe(name)}", *kw("name"))
    if name.casefold() in names:  # also on a case-insensitive file system, two steps never share a file
        raise InputError(f"steps[{i}]: step name {name!r} already used on line {names[name.casefold()]}",
                         *kw("name"))
    names[name.casefold()] = where[1]
    raw_params = YamlMap({k: v for k, v in node.items() if k not in ("type", "name")})
    raw_params.file, raw_params.line = where
    raw_params.key_lines = {k: v for k, v in getattr(node, "key_lines", {}).items()}
    params = check_mapping(raw_params, spec.model, f"steps[{i}] ({step_type} {name!r})", where)
    return Step(type=step_type, name=name, params=params, line=where[1], file=where[0])


def load_playbook(path: str | os.PathLike, step_types: Mapping[str, StepType] | None = None) -> Playbook:
    """Read and validate a playbook; steps are checked against the registered step types."""
    loaded = load_yaml(path)
    registry = discover_steps() if step_types is None else step_types
    return playbook_from_data(loaded, str(path), registry)


def looks_like(data: Mapping) -> str | None:
    """'playbook', 'inventory', 'profile' or None, judged by top-level keys."""
    if "steps" in data:
        return "playbook"
    if "bench" not in data and (set(data) & {"nic", "topology", "per_port", "tools", "fabric", "source", "copies"}
                                or isinstance(data.get("ocs"), dict) and "switch" in data["ocs"]):
        return "profile"
    if "ocs" in data or "hosts" in data or isinstance(data.get("bench"), dict):
        return "inventory"
    return None
