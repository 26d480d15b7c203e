"""The emulated host's mini shell: what `sh -c` (dash) does with a command line — `&&`, `||`, `;`, pipes of
commands that end, `> FILE`, `$?`, pathname expansion — the interactive login shell (bash), `sudo -n`, the shell
builtins, the coreutils filters and `python3` running an uploaded agent program."""
from __future__ import annotations

import fnmatch
import logging
import posixpath
import shlex
from typing import TYPE_CHECKING

import paramiko

from devices.agent.hilagent import MIN_PYTHON
from devices.emulated.host import coreutils
from devices.emulated.host.context import ChannelGone, ExecContext, Handler
from devices.emulated.host.files import ls_names, read_file

if TYPE_CHECKING:
    from devices.emulated.host.server import EmulatedHostServer

log = logging.getLogger(__name__)


PYTHON_NAMES = ("python3", "python")  # how the harness launches the agent (HostResource.python)


class _ShellSyntax(ValueError):
    """A command line sh would refuse to parse (dash's message)."""


_GLOB = "*?["
_QUOTED_GLOB = dict(zip(_GLOB, "\ue000\ue001\ue002"))  # a quoted glob character, kept literal through shlex


def _mark_quoted_globs(command: str) -> str:
    """`command` with each quoted or escaped `*?[` replaced by a private character, so that after shlex has
    removed the quotes only the unquoted ones expand (`grep 'a*' f`: a pattern; `cat /sys/*/x`: a glob)."""
    out, quote, escaped = [], "", False
    for c in command:
        if escaped:  # the character after a backslash: literal
            escaped = False
            if c in _GLOB and not quote:
                out[-1] = _QUOTED_GLOB[c]  # for the backslash, which shlex would keep before a private character
                continue
            out.append(_QUOTED_GLOB.get(c, c))
            continue
        if c == "\\" and quote != "'":
            escaped = True
        elif c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        elif quote and c in _GLOB:
            c = _QUOTED_GLOB[c]
        out.append(c)
    return "".join(out)


def _unmark(text: str) -> str:
    return text.translate({ord(v): k for k, v in _QUOTED_GLOB.items()})


def _expand_word(ctx: ExecContext, word: str) -> list[str]:
    """Pathname expansion as dash does it: the matching paths of the host's file system and sysfs in C-locale
    order, the word itself when nothing matches (or it has no unquoted glob character)."""
    if not any(c in word for c in _GLOB):
        return [_unmark(word)]
    matches, part = ["/" if word.startswith("/") else ""], ""
    for part in (p for p in word.split("/") if p):
        if not any(c in part for c in _GLOB):
            matches = [posixpath.join(base, _unmark(part)) for base in matches]
            continue
        # quoted glob characters match only themselves; a leading dot is matched only by a dot (no hidden files)
        pattern = "".join({v: f"[{k}]" for k, v in _QUOTED_GLOB.items()}.get(c, c) for c in part)
        matches = [posixpath.join(base, name) for base in matches
                   for name in ls_names(ctx, ctx.path(base or ".")) or []
                   if not name.startswith(".") and fnmatch.fnmatchcase(name, pattern)]
    if not any(c in part for c in _GLOB):  # listed entries exist; a literal last component may not
        matches = [m for m in matches if read_file(ctx, m) is not None or ls_names(ctx, m) is not None]
    return sorted(matches, key=str.encode) or [_unmark(word)]


def _split_commands(command: str) -> list[tuple[str, list[list[str]]]]:
    """`a | b && c ; d` -> [('', [a-words, b-words]), ('&&', [c-words]), (';', [d-words])]. Quoted glob
    characters stay marked in the words (see _mark_quoted_globs); _expand_word expands or restores them."""
    lexer = shlex.shlex(_mark_quoted_globs(command), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    pieces: list[tuple[str, list[list[str]]]] = [("", [[]])]
    for token in lexer:
        if token in ("&&", ";", "||"):
            pieces.append((token, [[]]))
        elif token == "|":
            if not pieces[-1][1][-1]:
                raise _ShellSyntax('"|" unexpected')
            pieces[-1][1].append([])
        else:
            pieces[-1][1][-1].append(token)
    for _, pipeline in pieces:
        if len(pipeline) > 1 and not pipeline[-1]:
            raise _ShellSyntax("end of file unexpected")
    return [(op, pipeline) for op, pipeline in pieces if pipeline[0]]


def run_shell(ctx: ExecContext, command: str, status: int = 0) -> int:
    """Run `command` with `&&`, `||`, `;`, pipes of commands that end, `> FILE` (stdout into the virtual file
    system) and `$?` (`status`: the previous command's, in an interactive shell)."""
    try:
        pieces = _split_commands(command)
    except ValueError as exc:
        ctx.err(f"sh: 1: Syntax error: {exc}\n")
        return 2
    for op, pipeline in pieces:
        if (op == "&&" and status != 0) or (op == "||" and status == 0):
            continue
        pipeline = [[x for w in words for x in ([str(status)] if w == "$?" else _expand_word(ctx, w))]
                    for words in pipeline]
        status = _run_pipeline(ctx, pipeline)
    return status


def _streams(words: list[str]) -> str | None:
    """What a command streams until the client stops it (so it cannot be a pipe's stage), None if it ends."""
    while words[:1] in (["exec"], ["sudo"]):
        words = words[2:] if words[1:2] == ["-n"] else words[1:]
    name = posixpath.basename(words[0]) if words else ""
    if name in PYTHON_NAMES:
        return "the agent"
    if name == "ip" and "monitor" in words:
        return "ip monitor"
    if name == "nvidia-smi" and any(w in ("-l", "-lms") or w.startswith(("--loop", "-l=", "-lms=")) for w in words):
        return "nvidia-smi's loop"
    return None


def _run_pipeline(ctx: ExecContext, pipeline: list[list[str]]) -> int:
    """`a | b | c` as sh runs commands that end: each stage's stdout is the next one's stdin, the status is the
    last stage's. The stages run one after another (the emulated tools end), so a streaming command is refused."""
    if len(pipeline) == 1:
        return _run_simple(ctx, pipeline[0])
    for words in pipeline:
        if (what := _streams(words)) is not None:
            ctx.err(f"sh: 1: emulated host: {what} streams until stopped and cannot run in a pipe\n")
            return 2
    data = None  # the first stage reads the session's stdin
    for words in pipeline[:-1]:
        stage = ctx.with_stdin(data)
        stage._redirect = []
        _run_simple(stage, words)
        if data is None:  # what it left unread stays for the commands after the pipe
            ctx._stdin_buffer = stage._stdin_buffer
        data = b"".join(stage._redirect)
    return _run_simple(ctx.with_stdin(data), pipeline[-1])


def _filter(ctx: ExecContext, argv: list[str]) -> int:
    """A coreutils/grep filter over stdin or files of the host (coreutils.py)."""
    def read(word: str) -> bytes | None:
        content = read_file(ctx, ctx.path(word))
        return content.encode() if isinstance(content, str) else content
    tool = coreutils.FILTERS[posixpath.basename(argv[0])]
    out, err, status = tool(argv, ctx.read_stdin, read)  # stdin read only when an operand is `-` or none is given
    if out:
        ctx.out(out)
    if err:
        ctx.err(err)
    return status


class InteractiveShell:
    """What an engineer meets after `ssh host`: Debian's bash as a login shell with its default prompt
    (`user@host:~$ `, no colour) and readline's basic editing: echo, backspace, Ctrl-U, Ctrl-C (`^C`, status
    130), Ctrl-D on an empty line or `exit [N]` (`logout`). Under a pty output lines end in CRLF (ONLCR) and
    stderr joins stdout. Without a pty (`ssh -T host < script`) bash reads its commands from stdin instead: no
    prompt, no echo, no editing. A command's stdin is empty (the terminal stays the shell's), so a streaming
    command is refused: there would be no way to stop it but closing the session."""

    def __init__(self, server: "EmulatedHostServer", channel: paramiko.Channel, tty: bool):
        self.server, self.channel = server, channel
        self.ctx = ExecContext(server, channel, "-bash").with_stdin(b"")  # the terminal stays the shell's
        self.ctx.tty, self.ctx.bash = tty, True
        self.status = 0

    @property
    def prompt(self) -> str:
        """Debian's default PS1 without colour, `\\u@\\h:\\w\\$ `: the home directory shown as ~."""
        cwd, home = self.ctx.cwd, self.server.home
        where = "~" + cwd[len(home):] if cwd == home or cwd.startswith(home + "/") else cwd
        return f"{self.server.user}@{self.server.host_name.split('.')[0]}:{where}$ "

    def run(self) -> int:
        if not self.ctx.tty:
            return self.script()
        self.ctx.out(self.prompt)
        line, escape = bytearray(), b""
        while True:
            data = self.channel.recv(4096)
            if not data:
                return self.status  # the client closed its side: the session ends as on a hang-up
            for byte in data:
                char = bytes([byte])
                if escape or char == b"\x1b":  # cursor keys and the like: an escape sequence, not input
                    escape += char
                    if len(escape) > 1 and (escape[-1:].isalpha() or escape[-1:] == b"~"):
                        escape = b""
                    continue
                if char in (b"\r", b"\n"):
                    self.ctx.out("\n")
                    if (done := self.line(line.decode(errors="replace"))) is not None:
                        return done
                    line.clear()
                    self.ctx.out(self.prompt)
                elif char in (b"\x7f", b"\x08"):
                    if line:
                        line.pop()
                        self.ctx.out("\b \b")
                elif char == b"\x15":
                    self.ctx.out("\b \b" * len(line))
                    line.clear()
                elif char == b"\x03":
                    self.ctx.out("^C\n" + self.prompt)
                    line.clear()
                    self.status = 130
                elif char == b"\x04":
                    if not line:
                        self.ctx.err("logout\n")
                        return self.status
                elif byte >= 0x20 or char == b"\t":
                    line += char
                    self.ctx.out(char)

    def script(self) -> int:
        """Lines from stdin until EOF or `exit`."""
        pending = b""
        while True:
            data = self.channel.recv(4096)
            rows = (pending + data).split(b"\n")
            pending = rows.pop() if data else b""
            for row in rows:
                if (done := self.line(row.decode(errors="replace"))) is not None:
                    return done
            if not data:
                return self.status

    def line(self, text: str) -> int | None:
        """Run one line; the session's exit status when it was `exit`."""
        try:
            words = shlex.split(text)
        except ValueError:
            words = None
        if words and words[0] == "exit":
            if len(words) > 1 and not words[1].lstrip("-").isdigit():
                self.ctx.err(f"-bash: exit: {words[1]}: numeric argument required\n")
                return 2
            if self.ctx.tty:  # bash says it, on stderr, when an interactive login shell ends
                self.ctx.err("logout\n")
            return int(words[1]) & 255 if len(words) > 1 else self.status
        if not text.strip():
            return None
        try:
            pieces = _split_commands(text)
        except ValueError:
            pieces = []
        streaming = [what for _, pipeline in pieces for words in pipeline if (what := _streams(words))]
        if streaming:
            self.ctx.err(f"-bash: emulated host: {streaming[0]} streams until stopped; run it with "
                         "`ssh host COMMAND` instead\n")
            self.status = 2
            return None
        try:
            self.status = run_shell(self.ctx, text, self.status)
        except ChannelGone:
            raise
        except Exception as exc:  # a handler bug must not end the session
            log.exception("emulated host %s: %r failed", self.server.host_name, text)
            self.ctx.err(f"emulator: {type(exc).__name__}: {exc}\n")
            self.status = 1
        return None


def _not_found(ctx: ExecContext, name: str) -> int:
    """dash's complaint for `ssh host COMMAND`, bash's in the interactive login shell."""
    if not ctx.bash:
        ctx.err(f"sh: 1: {name}: not found\n")
    else:
        ctx.err(f"-bash: {name}: " + ("No such file or directory\n" if "/" in name else "command not found\n"))
    return 127


def has_tool(server: "EmulatedHostServer", path: str, tool: str) -> bool:
    """Whether `path` runs `tool` on this host: its bare name, or an absolute path where the host keeps it."""
    return (path == tool or path in server.tool_paths.get(tool, ())) and (tool in server.commands
                                                                         or tool in PYTHON_NAMES)


def _sudo(ctx: ExecContext, argv: list[str]) -> int:
    """sudo as the harness uses it, `sudo -n COMMAND...`: run as root when the host's user may (sudoers NOPASSWD:
    `sudo_allowed`), else sudo's own refusal. Without -n sudo would prompt: there is no terminal here."""
    words = argv[1:]
    if words[:1] != ["-n"]:
        ctx.err("sudo: a terminal is required to read the password; either use the -S option to read from "
                "standard input or configure an askpass helper\nsudo: a password is required\n")
        return 1
    if len(words) < 2:
        ctx.err("usage: sudo -h | -K | -k | -V\n")
        return 1
    if not ctx.server.sudo_allowed:
        ctx.err("sudo: a password is required\n")
        return 1
    ctx.server.sudo_commands.append(shlex.join(words[1:]))
    return _run_simple(ctx, words[1:])


def _run_simple(ctx: ExecContext, words: list[str]) -> int:
    home = ctx.server.home
    words = [home + w[1:] if w == "~" or w.startswith("~/") else w for w in words]  # tilde expansion
    target = None
    if ">" in words:
        at = words.index(">")
        if at + 1 >= len(words):
            ctx.err("sh: 1: Syntax error: newline unexpected\n")
            return 2
        target = ctx.path(words[at + 1])
        words = words[:at] + words[at + 2:]
        if posixpath.dirname(target) not in ctx.server.fs.dirs:
            ctx.err(f"sh: 1: cannot create {target}: Directory nonexistent\n")
            return 2
    if any(w in ("<", ">>", "&", "|&") for w in words):
        ctx.err("sh: 1: emulated host: input redirection, appending and background jobs are not supported\n")
        return 2
    if words and words[0] == "exec":
        words = words[1:]
    if not words:
        return 0
    name = words[0]
    if name.startswith("/") and not has_tool(ctx.server, name, posixpath.basename(name)) \
            and posixpath.basename(name) in ctx.server.tool_paths:
        return _not_found(ctx, name)
    handler = ctx.server.commands.get(name) or ctx.server.commands.get(posixpath.basename(name))
    if handler is None and posixpath.basename(name) in PYTHON_NAMES:
        handler = run_python
    if handler is None:
        handler = ctx.server.commands.get("*")
    if handler is None:
        return _not_found(ctx, name)
    if target is None:
        return handler(ctx, words)
    saved, ctx._redirect = ctx._redirect, []
    try:
        status = handler(ctx, words)
    finally:
        data, ctx._redirect = b"".join(ctx._redirect), saved
    with ctx.server.fs.lock:
        ctx.server.fs.files[target] = data
    return status


def _cd(ctx: ExecContext, argv: list[str]) -> int:
    """The builtin: the working directory of this shell (in a pipe a subshell's, as sh has it)."""
    if len(argv) > 2:
        ctx.err("-bash: cd: too many arguments\n" if ctx.bash else "sh: 1: cd: too many arguments\n")
        return 1 if ctx.bash else 2
    target = ctx.path(argv[1]) if len(argv) > 1 else ctx.server.home
    if ls_names(ctx, target) is None:
        exists = read_file(ctx, target) is not None
        if ctx.bash:
            ctx.err(f"-bash: cd: {argv[1]}: {'Not a directory' if exists else 'No such file or directory'}\n")
            return 1
        ctx.err(f"sh: 1: cd: can't cd to {argv[1]}\n")
        return 2
    ctx.cwd = target
    return 0


def _pwd(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(ctx.cwd + "\n")
    return 0


def _true(ctx: ExecContext, argv: list[str]) -> int:
    return 0


def _false(ctx: ExecContext, argv: list[str]) -> int:
    return 1


def _echo(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(" ".join(argv[1:]) + "\n")
    return 0


def _sleep(ctx: ExecContext, argv: list[str]) -> int:
    try:
        seconds = float(argv[1])
    except (IndexError, ValueError):
        ctx.err("sleep: missing or invalid operand\n")
        return 1
    ctx.sleep(seconds)
    return 0


def run_python(ctx: ExecContext, argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "-u"]
    if not args or args[0].startswith("-"):
        ctx.err("emulated host: python3 runs uploaded agent programs only\n")
        return 2
    path = ctx.path(args[0])
    with ctx.server.fs.lock:
        present = path in ctx.server.fs.files
    if not present:
        ctx.err(f"{argv[0]}: can't open file '{args[0]}': [Errno 2] No such file or directory\n")
        return 2
    if not ctx.server.tools.at_least("python", "%d.%d" % MIN_PYTHON):  # the agent's own first check, its words
        # the interpreter's own path (sys.executable): as run, or where the host keeps python3
        executable = argv[0] if argv[0].startswith("/") else ctx.server.tool_paths["python3"][0]
        ctx.err(f"hilagent: needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer; {executable} is "
                f"{ctx.server.tools.python}\n")
        return 3
    if len(args) < 2 or args[1] not in ctx.server.agent_commands:
        ctx.err(f"usage: {posixpath.basename(path)} {{{','.join(ctx.server.agent_commands)}}} ...\n")
        return 2
    return ctx.server.agent_commands[args[1]](ctx, args[1:])


COMMANDS: dict[str, Handler] = {
    "true": _true, "false": _false, "echo": _echo, "sleep": _sleep, "cd": _cd, "pwd": _pwd, "sudo": _sudo,
    **{name: _filter for name in coreutils.FILTERS},
}
