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

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from devices.ocs import OcsConfigError, parse_url, protocol_names
from devices.resources import Bench, HostResource, NicPort, OcsResource
from harness.errors import InputError

DEFAULT_BENCH = "emulated:mixnet-testbed"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


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


def _parse(path: Path, shown: str) -> tuple[Any, bytes]:
    try:
        raw = path.read_bytes()
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
    data = _load_file(path, (), files)
    if not isinstance(data, YamlMap):
        kind = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(f"expected a YAML mapping at the top level, found {kind}", str(path),
                         getattr(data, "line", 1))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return LoadedYaml(data, files, digest.hexdigest())


# ------------------------------------------------------------------------------------ schema checks
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "a list",
               dict: "a mapping", type(None): "null"}


def _type_name(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _is_instance(value: Any, types: type | tuple[type, ...]) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, float) and float in types:
        return value == value and abs(value) != float("inf")  # NaN/inf are never valid settings
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def check_mapping(node: Any, schema: Mapping[str, tuple], what: str, where: tuple[str, int | None]) -> dict:
    """Validate `node` against {key: (type, default|REQUIRED)}; return a plain dict with defaults filled."""
    if not isinstance(node, dict):
        raise InputError(f"{what}: expected a mapping, found {_describe(node)}", *where)
    key_where = node.where if isinstance(node, YamlMap) else (lambda k=None: where)
    unknown = [k for k in node if k not in schema]
    if unknown:
        known = ", ".join(schema) or "none"
        raise InputError(f"{what}: unknown key {unknown[0]!r} (expected one of: {known})", *key_where(unknown[0]))
    out = {}
    for key, spec in schema.items():
        types, default = spec[0], spec[1]
        if key not in node:
            if default is REQUIRED:
                raise InputError(f"{what}: missing required key {key!r} ({_type_name(types)})", *where)
            out[key] = default
            continue
        value = node[key]
        if not _is_instance(value, types):
            raise InputError(f"{what}.{key}: expected {_type_name(types)}, found {_describe(value)}",
                             *key_where(key))
        allowed = types if isinstance(types, tuple) else (types,)
        if float in allowed and int not in allowed and type(value) is int:
            value = float(value)
        problem = _out_of_range(key, value)
        if problem:
            raise InputError(f"{what}.{key}: expected {problem}, found {value!r}", *key_where(key))
        out[key] = value
    return out


def _out_of_range(key: str, value: Any) -> str | None:
    """The semantic range every parameter of its kind must meet, by its name: ports, intervals (> 0),
    durations and timeouts (>= 0), retry counts (>= 0). None when `value` is fine."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if key == "port" or key.endswith("_port"):
        return None if isinstance(value, int) and 1 <= value <= 65535 else "a port number in 1..65535"
    if "interval" in key:
        return None if value > 0 else "a positive interval"
    if key.endswith(("_s", "_ms", "_us")) or "timeout" in key or key in ("retries", "seconds"):
        return None if value >= 0 else "a value >= 0"
    return None


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} {text[:37] + '...' if len(text) > 40 else text}"


# ---------------------------------------------------------------------------------------- inventory
_BENCH_SCHEMA = {"name": (str, REQUIRED), "emulated": (bool, False)}
_OCS_SCHEMA = {"protocol": (str, REQUIRED), "url": (str, REQUIRED), "size": (list, REQUIRED),
               "allowed_ports": (list, REQUIRED), "user": ((str, type(None)), None),
               "password_env": ((str, type(None)), None), "baudrate": (int, 38400)}
_HOST_SCHEMA = {"address": (str, REQUIRED), "port": (int, 22), "user": (str, "root"),
                "identity_file": ((str, type(None)), None), "known_hosts": ((str, type(None)), None),
                "python": (str, "python3"), "nics": (list, [])}
_NIC_SCHEMA = {"netdev": (str, REQUIRED), "rdma_dev": (str, REQUIRED), "rdma_port": (int, 1),
               "ocs": (str, REQUIRED), "tx": (int, REQUIRED), "rx": (int, REQUIRED)}
_INVENTORY_SCHEMA = {"bench": (dict, REQUIRED), "ocs": (dict, REQUIRED), "hosts": (dict, REQUIRED)}
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


def _check_name(name: Any, what: str, where: tuple) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise InputError(f"{what}: name {name!r} must be letters, digits, '_', '.', '-'", *where)
    return name


def bench_from_data(data: YamlMap, source: str, env: Mapping[str, str] | None = None) -> Bench:
    """Build a Bench from an already loaded inventory mapping."""
    env = os.environ if env is None else env
    top_where = (data.file, data.line)
    if "password" in data:
        raise InputError("passwords never go in files: set an environment variable and name it with "
                         "password_env", *data.where("password"))
    top = check_mapping(data, _INVENTORY_SCHEMA, "inventory", top_where)
    bench = check_mapping(top["bench"], _BENCH_SCHEMA, "bench", data.where("bench"))
    ocs_map: YamlMap = top["ocs"]
    if not ocs_map:
        raise InputError("ocs: expected at least one switch", *data.where("ocs"))
    switches: dict[str, OcsResource] = {}
    for name, node in ocs_map.items():
        where = ocs_map.where(name)
        _check_name(name, "ocs", where)
        if isinstance(node, dict) and "password" in node:
            raise InputError(f"ocs.{name}.password: passwords never go in files: set an environment "
                             "variable and name it with password_env", *node.where("password"))
        spec = check_mapping(node, _OCS_SCHEMA, f"ocs.{name}", where)
        if spec["protocol"] not in protocol_names():
            raise InputError(f"ocs.{name}.protocol: expected one of {', '.join(protocol_names())}, found "
                             f"{spec['protocol']!r}", *node.where("protocol"))
        try:
            parse_url(spec["url"], spec["protocol"])  # the URL forms that protocol's registry entry accepts
        except OcsConfigError as exc:
            raise InputError(f"ocs.{name}.url: {exc}", *node.where("url")) from None
        size = spec["size"]
        if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 4096
                                     for s in size):
            raise InputError(f"ocs.{name}.size: expected [ingress_count, egress_count] (integers 1..4096), "
                             f"found {list(size)!r}", *node.where("size"))
        allowed_node = spec["allowed_ports"]
        allowed = parse_port_list(allowed_node, size[0] + size[1], f"ocs.{name}.allowed_ports",
                                  lambda i, n=allowed_node: n.where(i) if isinstance(n, YamlList) else where)
        if not 1 <= spec["baudrate"] <= 10_000_000:
            raise InputError(f"ocs.{name}.baudrate: expected 1..10000000", *node.where("baudrate"))
        password = None
        if spec["password_env"]:
            password = env.get(spec["password_env"])
            if password is None:
                raise InputError(f"ocs.{name}.password_env: environment variable {spec['password_env']} is "
                                 "not set", *node.where("password_env"))
        switches[name] = OcsResource(name=name, protocol=spec["protocol"], url=spec["url"],
                                     size=(size[0], size[1]), allowed_ports=allowed, user=spec["user"],
                                     password=password, baudrate=spec["baudrate"])

    hosts_map: YamlMap = top["hosts"]
    hosts: dict[str, HostResource] = {}
    nic_ports: list[NicPort] = []
    used_ocs_ports: dict[tuple[str, int], str] = {}
    for name, node in hosts_map.items():
        where = hosts_map.where(name)
        _check_name(name, "hosts", where)
        spec = check_mapping(node, _HOST_SCHEMA, f"hosts.{name}", where)
        if not 1 <= spec["port"] <= 65535:
            raise InputError(f"hosts.{name}.port: expected 1..65535, found {spec['port']}", *node.where("port"))
        hosts[name] = HostResource(name=name, address=spec["address"], port=spec["port"], user=spec["user"],
                                   identity_file=spec["identity_file"], known_hosts=spec["known_hosts"],
                                   strict_host_key=not bench["emulated"], python=spec["python"])
        nics = spec["nics"]
        netdevs: set[str] = set()
        for i, nic_node in enumerate(nics):
            nwhere = nics.where(i) if isinstance(nics, YamlList) else where
            what = f"hosts.{name}.nics[{i}]"
            nic = check_mapping(nic_node, _NIC_SCHEMA, what, nwhere)
            kw = nic_node.where if isinstance(nic_node, YamlMap) else (lambda k=None: nwhere)
            if nic["netdev"] in netdevs:
                raise InputError(f"{what}: netdev {nic['netdev']!r} appears twice on host {name}", *kw("netdev"))
            netdevs.add(nic["netdev"])
            switch = switches.get(nic["ocs"])
            if switch is None:
                raise InputError(f"{what}.ocs: no switch named {nic['ocs']!r} (known: "
                                 f"{', '.join(switches)})", *kw("ocs"))
            n_in, n_out = switch.size
            checks = (("tx", 1, n_in, "an ingress port"), ("rx", n_in + 1, n_in + n_out, "an egress port"))
            for key, low, high, kind in checks:
                port = nic[key]
                if not low <= port <= high:
                    raise InputError(f"{what}.{key}: {port} is not {kind} of {switch.name} ({low}..{high})", *kw(key))
                if port not in switch.allowed_ports:
                    raise InputError(f"{what}.{key}: port {port} is not in {switch.name}.allowed_ports", *kw(key))
                owner = used_ocs_ports.get((switch.name, port))
                if owner:
                    raise InputError(f"{what}.{key}: {switch.name} port {port} is already used by {owner}", *kw(key))
                used_ocs_ports[(switch.name, port)] = f"{name}:{nic['netdev']}"
            if not 1 <= nic["rdma_port"] <= 255:
                raise InputError(f"{what}.rdma_port: expected 1..255", *kw("rdma_port"))
            nic_ports.append(NicPort(host=name, netdev=nic["netdev"], rdma_dev=nic["rdma_dev"],
                                     rdma_port=nic["rdma_port"], ocs=switch.name, ocs_tx=nic["tx"],
                                     ocs_rx=nic["rx"]))
    return Bench(name=bench["name"], emulated=bench["emulated"], ocs=switches, hosts=hosts,
                 nic_ports=tuple(nic_ports), source=source)


def load_inventory(path: str | os.PathLike) -> Bench:
    """Read and validate a bench inventory (ARCHITECTURE.md). Passwords come only from `password_env`."""
    loaded = load_yaml(path)
    return bench_from_data(loaded.data, str(path))


# ----------------------------------------------------------------------------------------- playbook
@dataclass(frozen=True)
class StepType:
    name: str
    schema: dict[str, tuple]
    impl: Any = None
    # resume_point(run_dir, step, last_logged_cycle) -> cycles already done; None: the step reruns whole
    resume_point: Any = None


class RegistrationError(TypeError):
    """A step type registered twice (two modules would silently fight over one name)."""


STEP_TYPES: dict[str, StepType] = {}
# Extra top-level playbook keys a lab (or the runner) may declare: {key: (type, default)}.
PLAYBOOK_OPTIONS: dict[str, tuple] = {}


def register_step(type_name: str, schema: Mapping[str, tuple] | None = None,
                  registry: dict[str, StepType] | None = None, *, resume_point=None):
    """Declare a step type and its params {param: (type, default | REQUIRED)}.

    Registers at once; the returned decorator attaches the implementation:
    `@register_step("ocs_apply", {"mapping": (dict, REQUIRED)})` above a function or class. A name already
    registered is refused (RegistrationError). `resume_point`: see StepType.
    """
    registry = STEP_TYPES if registry is None else registry
    if type_name in registry:
        raise RegistrationError(f"step type {type_name!r} is already registered")
    schema = dict(schema or {})
    for param, spec in schema.items():
        if not isinstance(spec, tuple) or len(spec) < 2:
            raise TypeError(f"step {type_name}: schema for {param!r} must be (type, default|REQUIRED)")
        if param in ("type", "name"):
            raise TypeError(f"step {type_name}: 'type' and 'name' are reserved step keys")
    registry[type_name] = StepType(type_name, schema, resume_point=resume_point)

    def attach(impl):
        if registry[type_name].impl is not None:
            raise RegistrationError(f"step type {type_name!r} already has an implementation")
        registry[type_name] = StepType(type_name, schema, impl, resume_point)
        return impl

    return attach


@dataclass(frozen=True)
class Step:
    type: str
    name: str
    params: dict
    line: int | None
    file: str = ""

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


_PLAYBOOK_SCHEMA = {"name": (str, REQUIRED), "description": (str, ""), "bench": (str, DEFAULT_BENCH),
                    "seed": (int, 0), "cycles": (int, 1), "steps": (list, REQUIRED), "sweep": (dict, None)}


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
    return STEP_TYPES


def playbook_from_data(loaded: LoadedYaml, source: str, step_types: Mapping[str, StepType]) -> Playbook:
    data = loaded.data
    schema = {**_PLAYBOOK_SCHEMA, **PLAYBOOK_OPTIONS}
    top = check_mapping(data, schema, "playbook", (data.file, data.line))
    _check_name(top["name"], "playbook.name", data.where("name"))
    if not 1 <= top["cycles"] <= 10_000_000:
        raise InputError(f"playbook.cycles: expected 1..10000000, found {top['cycles']}", *data.where("cycles"))
    if not 0 <= top["seed"] < 2**63:
        raise InputError(f"playbook.seed: expected 0..2**63-1, found {top['seed']}", *data.where("seed"))
    steps_node = top["steps"]
    steps: list[Step] = []
    names: dict[str, int | None] = {}
    for i, node in enumerate(steps_node):
        where = steps_node.where(i) if isinstance(steps_node, YamlList) else (data.file, data.line)
        if not isinstance(node, dict):
            raise InputError(f"steps[{i}]: expected a mapping with a 'type', found {_describe(node)}", *where)
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
        if not isinstance(name, str) or not name:
            raise InputError(f"steps[{i}].name: expected a non-empty string", *kw("name"))
        if name in names:
            raise InputError(f"steps[{i}]: step name {name!r} already used on line {names[name]}", *kw("name"))
        names[name] = where[1]
        raw_params = YamlMap({k: v for k, v in node.items() if k not in ("type", "name")})
        raw_params.file, raw_params.line = where
        raw_params.key_lines = {k: v for k, v in getattr(node, "key_lines", {}).items()}
        params = check_mapping(raw_params, spec.schema, f"steps[{i}] ({step_type} {name!r})", where)
        steps.append(Step(type=step_type, name=name, params=params, line=where[1], file=where[0]))
    if not steps:
        raise InputError("playbook.steps: expected at least one step", *data.where("steps"))
    options = {k: top[k] for k in PLAYBOOK_OPTIONS}
    sweep = None
    if top["sweep"] is not None:
        from harness.sweep import check_sweep

        sweep = check_sweep(top["sweep"], steps, step_types, data.where("sweep"))
    return Playbook(name=top["name"], description=top["description"], bench=top["bench"], seed=top["seed"],
                    cycles=top["cycles"], steps=steps, source=source, sha256=loaded.digest, options=options,
                    sweep=sweep)


def load_playbook(path: str | os.PathLike, step_types: Mapping[str, StepType] | None = None) -> Playbook:
    """Read and validate a playbook; steps are checked against the registered step types."""
    loaded = load_yaml(path)
    registry = discover_steps() if step_types is None else step_types
    return playbook_from_data(loaded, str(path), registry)


def looks_like(data: Mapping) -> str | None:
    """'playbook', 'inventory' or None, judged by top-level keys."""
    if "steps" in data:
        return "playbook"
    if "ocs" in data or "hosts" in data or isinstance(data.get("bench"), dict):
        return "inventory"
    return None
