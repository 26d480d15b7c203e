"""File transfer to and from the emulated host: SFTP (paramiko's server over the host's files; OpenSSH >= 9's
scp speaks it) and the remote end of legacy `scp -O`."""
from __future__ import annotations

import os
import posixpath
import stat
import time
from typing import TYPE_CHECKING

import paramiko

from devices.emulated.host.context import ChannelGone, ExecContext, Handler
from devices.emulated.host.files import ls_names, read_file
from devices.emulated.host.ssh import forget_accepted

if TYPE_CHECKING:
    from devices.emulated.host.server import SshServer


class SftpSession(paramiko.SFTPServer):
    """paramiko's SFTP server on its own thread (one per session), the channel off the accept queue."""

    def start_subsystem(self, name, transport, channel):
        forget_accepted(channel)
        super().start_subsystem(name, transport, channel)

    def finish_subsystem(self):
        try:  # sshd's internal-sftp ends with status 0; scp takes a session without one (-1) as failed
            self.sock.send_exit_status(0)
        except (OSError, EOFError):
            pass
        super().finish_subsystem()


class _LongName(paramiko.SFTPAttributes):
    """A directory entry whose long name (what `sftp`'s `ls -l` prints) is the line OpenSSH's sftp-server writes
    (sftp-common.c ls_file: "%s %3u %-*s %-*s %8llu %s %s", strmode's 11 characters, names at least 8 wide,
    "%b %e %H:%M" within half a year, else "%b %e  %Y")."""
    owner = "root"

    def __str__(self) -> str:
        mode = super().__str__()[:10] + " "
        recent = 0 <= time.time() - self.st_mtime < 365 * 24 * 3600 / 2
        when = time.strftime("%b %e %H:%M" if recent else "%b %e  %Y", time.localtime(self.st_mtime))
        return (f"{mode} {1:3d} {self.owner:<8} {self.owner:<8} {self.st_size or 0:8d} {when} "
                f"{getattr(self, 'filename', '?')}")


class HostSftp(paramiko.SFTPServerInterface):
    """The host's files over SFTP: the virtual file system (read, write, create, remove, rename, mkdir, rmdir)
    and the emulated sysfs (listed and read; read-only, as sysfs is to the non-root user)."""

    def __init__(self, server: SshServer, *args, **kwargs):
        super().__init__(server, *args, **kwargs)
        self.host = server.host
        self.fs = self.host.fs
        self.ctx = ExecContext(self.host, None, "internal-sftp")  # for read_file/ls_names: no channel I/O

    def canonicalize(self, path: str) -> str:
        return self.ctx.path(path or ".")  # relative to the home directory, as sshd's sftp-server starts there

    def attributes(self, path: str, listed: bool = False) -> paramiko.SFTPAttributes | int:
        attr = paramiko.SFTPAttributes()  # exactly this class: paramiko's server packs no subclass
        mine = path.startswith(self.host.home + "/") or path == self.host.home or path in self.fs.files
        attr.st_uid = attr.st_gid = 1000 if mine else 0
        attr.st_atime = attr.st_mtime = int(time.time())
        if ls_names(self.ctx, path) is not None:
            attr.st_mode, attr.st_size = stat.S_IFDIR | 0o755, 4096
            return attr
        content = read_file(self.ctx, path)
        if content is None:
            if not listed:
                return paramiko.SFTP_NO_SUCH_FILE
            attr.st_mode, attr.st_size = stat.S_IFDIR | 0o755, 0  # a sysfs entry we only list (a device's dir)
            return attr
        with self.fs.lock:
            mine = path in self.fs.files
        attr.st_mode = stat.S_IFREG | (0o644 if mine else 0o444)
        attr.st_size = len(content.encode() if isinstance(content, str) else content)
        return attr

    def stat(self, path: str):
        return self.attributes(self.canonicalize(path))

    lstat = stat

    def list_folder(self, path: str):
        where = self.canonicalize(path)
        names = ls_names(self.ctx, where)
        if names is None:
            return paramiko.SFTP_NO_SUCH_FILE
        entries = []
        for name in names:
            entry = _LongName()
            entry.__dict__.update(vars(self.attributes(posixpath.join(where, name), listed=True)))
            entry.filename, entry.owner = name, self.host.user if entry.st_uid else "root"
            entries.append(entry)
        return entries

    def open(self, path: str, flags: int, attr):
        where = self.canonicalize(path)
        if ls_names(self.ctx, where) is not None:
            return paramiko.SFTP_FAILURE  # a directory
        content = read_file(self.ctx, where)
        data = bytearray(content.encode() if isinstance(content, str) else content or b"")
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writing:
            with self.fs.lock:
                mine = where in self.fs.files
                parent = posixpath.dirname(where) in self.fs.dirs
            if content is not None and not mine:
                return paramiko.SFTP_PERMISSION_DENIED
            if not parent or (content is None and not flags & os.O_CREAT):
                return paramiko.SFTP_NO_SUCH_FILE
            if content is not None and flags & os.O_CREAT and flags & os.O_EXCL:
                return paramiko.SFTP_FAILURE
            if flags & os.O_TRUNC:
                data.clear()
            with self.fs.lock:
                self.fs.files[where] = bytes(data)
        elif content is None:
            return paramiko.SFTP_NO_SUCH_FILE
        return _SftpFile(self, where, data, writing, flags)

    def remove(self, path: str):
        where = self.canonicalize(path)
        with self.fs.lock:
            if self.fs.files.pop(where, None) is not None:
                return paramiko.SFTP_OK
        return paramiko.SFTP_NO_SUCH_FILE if read_file(self.ctx, where) is None else paramiko.SFTP_PERMISSION_DENIED

    def rename(self, oldpath: str, newpath: str):
        old, new = self.canonicalize(oldpath), self.canonicalize(newpath)
        with self.fs.lock:
            if old not in self.fs.files:
                return paramiko.SFTP_NO_SUCH_FILE
            if posixpath.dirname(new) not in self.fs.dirs or new in self.fs.dirs:
                return paramiko.SFTP_FAILURE
            self.fs.files[new] = self.fs.files.pop(old)
        return paramiko.SFTP_OK

    posix_rename = rename

    def mkdir(self, path: str, attr):
        where = self.canonicalize(path)
        with self.fs.lock:
            if where in self.fs.dirs or where in self.fs.files:
                return paramiko.SFTP_FAILURE
            if posixpath.dirname(where) not in self.fs.dirs:
                return paramiko.SFTP_NO_SUCH_FILE
            self.fs.dirs.add(where)
        return paramiko.SFTP_OK

    def rmdir(self, path: str):
        where = self.canonicalize(path)
        with self.fs.lock:
            if where not in self.fs.dirs:
                return paramiko.SFTP_NO_SUCH_FILE
            prefix = where.rstrip("/") + "/"
            if where in ("/", "/home", "/tmp", self.host.home) or \
                    any(p.startswith(prefix) for p in list(self.fs.files) + list(self.fs.dirs)):
                return paramiko.SFTP_FAILURE
            self.fs.dirs.discard(where)
        return paramiko.SFTP_OK

    def chattr(self, path: str, attr):
        return paramiko.SFTP_OK if read_file(self.ctx, self.canonicalize(path)) is not None \
            or ls_names(self.ctx, self.canonicalize(path)) is not None else paramiko.SFTP_NO_SUCH_FILE


class _SftpFile(paramiko.SFTPHandle):
    """An open file: a snapshot read at open (a sysfs file is rendered once, as a read of it would); writes
    reach the host's file system at each write, so a concurrent `cat` sees them as on a real host."""

    def __init__(self, sftp: HostSftp, path: str, data: bytearray, writing: bool, flags: int):
        super().__init__(flags)
        self.sftp, self.path, self.data, self.writing = sftp, path, data, writing
        self.append = bool(flags & os.O_APPEND)

    def read(self, offset: int, length: int):
        return bytes(self.data[offset:offset + length])

    def write(self, offset: int, data: bytes):
        if not self.writing:
            return paramiko.SFTP_PERMISSION_DENIED
        if self.append:
            offset = len(self.data)
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset:offset + len(data)] = data
        with self.sftp.fs.lock:
            self.sftp.fs.files[self.path] = bytes(self.data)
        return paramiko.SFTP_OK

    def stat(self):
        return self.sftp.attributes(self.path)

    def chattr(self, attr):
        return paramiko.SFTP_OK


def _scp(ctx: ExecContext, argv: list[str]) -> int:
    """The remote end of legacy `scp -O` (rcp's protocol): `scp -t TARGET` receives one file or more, `scp -f
    PATH...` sends them; single files only (no -r). Each message is acknowledged by a NUL byte; a refusal is
    \\x01 and the message, as OpenSSH's scp sends it."""
    words = [w for w in argv[1:] if w not in ("-v", "-p", "-q", "-d", "--")]
    if len(words) < 2 or words[0] not in ("-t", "-f") or any(w.startswith("-") for w in words[1:]):
        ctx.err("scp: emulated host: only `scp -t TARGET` and `scp -f PATH...` (single files) are served\n")
        return 1

    def exact(n: int) -> bytes:
        while len(ctx._stdin_buffer) < n:
            data = ctx.channel.recv(65536)
            if not data:
                raise ChannelGone()
            ctx._stdin_buffer += data
        out, ctx._stdin_buffer = ctx._stdin_buffer[:n], ctx._stdin_buffer[n:]
        return out

    def line() -> bytes:
        while b"\n" not in ctx._stdin_buffer:
            data = ctx.channel.recv(65536)
            if not data:
                return b""
            ctx._stdin_buffer += data
        out, _, ctx._stdin_buffer = ctx._stdin_buffer.partition(b"\n")
        return out

    def refuse(message: str) -> int:
        ctx.out(b"\x01scp: " + message.encode() + b"\n")
        return 1

    fs = ctx.server.fs
    if words[0] == "-t":
        target = ctx.path(words[1])
        ctx.out(b"\0")
        while header := line():
            kind, rest = header[:1], header[1:].decode(errors="replace")
            if kind == b"T":  # -p's times: acknowledged, not kept
                ctx.out(b"\0")
                continue
            if kind != b"C":
                return refuse(f"emulated host: {header[:1].decode()!r} (directories, -r) is not supported")
            _, size, name = rest.split(" ", 2)
            path = posixpath.join(target, name) if target in fs.dirs else target
            if path not in fs.files and read_file(ctx, path) is not None:
                return refuse(f"{path}: Permission denied")
            if posixpath.dirname(path) not in fs.dirs:
                return refuse(f"{path}: No such file or directory")
            ctx.out(b"\0")
            data = exact(int(size))
            exact(1)  # the sender's NUL after the data
            with fs.lock:
                fs.files[path] = data
            ctx.out(b"\0")
        return 0
    status = 0
    if exact(1) != b"\0":
        return 1
    for word in words[1:]:
        path = ctx.path(word)
        content = read_file(ctx, path)
        if content is None:
            ctx.out(f"\x01scp: {word}: No such file or directory\n")
            status = 1
            continue
        data = content.encode() if isinstance(content, str) else content
        mode = "0644" if path in fs.files else "0444"
        ctx.out(f"C{mode} {len(data)} {posixpath.basename(path)}\n")
        if exact(1) != b"\0":
            return 1
        ctx.out(data + b"\0")
        if exact(1) != b"\0":
            return 1
    return status


COMMANDS: dict[str, Handler] = {"scp": _scp}
