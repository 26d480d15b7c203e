"""The emulated host's files: the virtual file system (uploads, `> FILE`) and the sysfs rendered from the bench
(`/sys/class/infiniband`, `/sys/class/net`), and the tools that read and change them."""
from __future__ import annotations

import hashlib
import posixpath
import threading

from devices.emulated import dataplane, formats
from devices.emulated.host.context import ExecContext, Handler
from devices.timing import now_ns


class VirtualFs:
    """Files uploaded to the host (the agent program), kept in memory per host."""

    def __init__(self, home: str):
        self.lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.dirs = {"/", "/home", home, "/tmp"}

    def mkdir(self, path: str) -> None:
        with self.lock:
            while path not in self.dirs:
                self.dirs.add(path)
                path = posixpath.dirname(path)


def _mkdir(ctx: ExecContext, argv: list[str]) -> int:
    paths = [a for a in argv[1:] if not a.startswith("-")]
    if not paths:
        ctx.err("mkdir: missing operand\n")
        return 1
    for path in paths:
        ctx.server.fs.mkdir(ctx.path(path))
    return 0


def _rm(ctx: ExecContext, argv: list[str]) -> int:
    with ctx.server.fs.lock:
        for path in (a for a in argv[1:] if not a.startswith("-")):
            ctx.server.fs.files.pop(ctx.path(path), None)
    return 0


def _mv(ctx: ExecContext, argv: list[str]) -> int:
    """`mv [-f] SOURCE DEST` of an uploaded file: a rename, whole at once (what an upload relies on), GNU mv's
    words when the source is missing."""
    words = [a for a in argv[1:] if a not in ("-f", "--force")]
    if len(words) != 2 or any(w.startswith("-") for w in words):
        ctx.err("mv: the emulated host moves one file: mv [-f] SOURCE DEST\n")
        return 1
    source, dest = (ctx.path(w) for w in words)
    with ctx.server.fs.lock:
        if source not in ctx.server.fs.files:
            ctx.err(f"mv: cannot stat '{words[0]}': No such file or directory\n")
            return 1
        if dest in ctx.server.fs.dirs:
            dest = posixpath.join(dest, posixpath.basename(source))
        ctx.server.fs.files[dest] = ctx.server.fs.files.pop(source)
    return 0


def read_file(ctx: ExecContext, path: str) -> str | bytes | None:
    """A virtual file, or an emulated sysfs file rendered from the bench now."""
    with ctx.server.fs.lock:
        if path in ctx.server.fs.files:
            return ctx.server.fs.files[path]
    parts = path.strip("/").split("/")
    if parts[:3] == ["sys", "class", "infiniband"] and len(parts) >= 7 and parts[4] == "ports":
        model = ctx.server.nic_by_rdma(parts[3], int(parts[5]) if parts[5].isdigit() else -1)
        if model is not None:
            name = "/".join(parts[6:])
            octets = (dataplane.counters(ctx.bench, model.key).at(now_ns()) if name.endswith("_data")
                      else (0.0, 0.0))
            return formats.sysfs_ib_port_file(ctx.bench.nic_snapshot(ctx.host, model.netdev), name, octets)
    if parts[:3] == ["sys", "class", "net"] and len(parts) == 5:
        model = ctx.server.nic_by_netdev(parts[3])
        if model is not None:
            return formats.sysfs_net_file(ctx.bench.nic_snapshot(ctx.host, model.netdev), model, parts[4])
    return None


def _cat(ctx: ExecContext, argv: list[str]) -> int:
    paths = [a for a in argv[1:] if a != "-"]
    if not paths:  # stdin, copied as it comes (a real cat writes each read before the next)
        for data in ctx.stdin_chunks():
            ctx.out(data)
        return 0
    status = 0
    for word in paths:
        content = read_file(ctx, ctx.path(word))
        if content is None:
            ctx.err(f"cat: {word}: No such file or directory\n")
            status = 1
        else:
            ctx.out(content)
    return status


def _sha256sum(ctx: ExecContext, argv: list[str]) -> int:
    status = 0
    for word in argv[1:]:
        content = read_file(ctx, ctx.path(word))
        if content is None:
            ctx.err(f"sha256sum: {word}: No such file or directory\n")
            status = 1
            continue
        data = content.encode() if isinstance(content, str) else content
        ctx.out(f"{hashlib.sha256(data).hexdigest()}  {word}\n")
    return status


def ls_names(ctx: ExecContext, path: str) -> list[str] | None:
    """The entries of a directory of the emulated host (its RDMA and net sysfs classes and the virtual files),
    None when there is no such directory."""
    models = ctx.bench.nic_ports(ctx.host)
    parts = path.rstrip("/").split("/")[1:] if path != "/" else []
    if parts in (["sys"], ["sys", "class"]):  # the way down to the classes below
        return ["class"] if parts == ["sys"] else ["infiniband", "net"]
    if parts == ["sys", "class", "infiniband"]:
        return sorted({m.rdma_dev for m in models})
    if parts == ["sys", "class", "net"]:
        return sorted({"lo"} | {m.netdev for m in models})
    if parts[:3] == ["sys", "class", "infiniband"] and len(parts) >= 5 and \
            any(m.rdma_dev == parts[3] for m in models):
        if parts[4:] == ["device", "net"]:
            return sorted(m.netdev for m in models if m.rdma_dev == parts[3])
        if parts[4:] == ["ports"]:
            return sorted(str(m.rdma_port) for m in models if m.rdma_dev == parts[3])
        return None
    fs = ctx.server.fs
    with fs.lock:
        if path not in fs.dirs:
            return None
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in list(fs.files) + list(fs.dirs)
                       if p.startswith(prefix) and p != prefix} | ({"sys"} if path == "/" else set()))


def _ls(ctx: ExecContext, argv: list[str]) -> int:
    """`ls [-1] [PATH...]` as a non-terminal gets it: one name a line; several directories under `PATH:` heads."""
    paths = [a for a in argv[1:] if a != "-1"]
    if any(a.startswith("-") for a in paths):
        ctx.err("emulated ls supports [-1] [PATH...] only\n")
        return 2
    status, blocks = 0, []
    for word in paths or ["."]:
        path = ctx.path(word)
        names = ls_names(ctx, posixpath.normpath(path))
        if names is None:
            if read_file(ctx, path) is not None:
                blocks.append((None, [word]))
                continue
            ctx.err(f"ls: cannot access '{word}': No such file or directory\n")
            status = 2
            continue
        blocks.append((word, names))
    files = [n for head, names in blocks if head is None for n in names]
    dirs = [(head, names) for head, names in blocks if head is not None]
    out = "".join(f"{n}\n" for n in files)
    for i, (head, names) in enumerate(dirs):
        if len(paths) > 1:
            out += ("\n" if out else "") + f"{head}:\n"
        out += "".join(f"{n}\n" for n in names)
    ctx.out(out)
    return status


COMMANDS: dict[str, Handler] = {"mkdir": _mkdir, "rm": _rm, "mv": _mv, "cat": _cat, "sha256sum": _sha256sum,
                                "ls": _ls}
