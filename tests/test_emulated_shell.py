"""The emulated host's shell as an engineer pokes at it: pipes into grep/head/tail/wc/sort/cut/uniq/tr (held byte
for byte to this machine's real GNU grep 3.8 / coreutils 9.1 in the C locale, the independent peer), a login
shell under a pty (paramiko's invoke_shell and the stock OpenSSH client), and SFTP/scp over the host's files."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.emulated.host import coreutils

_C = {**os.environ, "LC_ALL": "C"}
_TEXT = (b"eth0 UP 100\nlo UNKNOWN 0\nens1f0np0 DOWN 25\nens1f1np1 UP 9\n\nfoo_bar up-link 7.5\n"
         b"Foo bar baz -3\nx\tTAB\tfield\n10 apples\n2 pears\n10 apples\n")
_FILES = {"a.txt": b"alpha\nbeta\ngamma\n", "b.txt": b"beta 2\nno newline at end"}

CASES = [
    ["grep", "UP"], ["grep", "-i", "up"], ["grep", "-v", "UP"], ["grep", "-c", "UP"], ["grep", "-n", "a"],
    ["grep", "-w", "up"], ["grep", "-iw", "up"], ["grep", "-x", "x\tTAB\tfield"], ["grep", "-E", "UP|DOWN"],
    ["grep", "UP\\|DOWN"], ["grep", "-E", "^[0-9]+ "], ["grep", "^[[:digit:]]\\+ "], ["grep", "-F", "7.5"],
    ["grep", "7.5"], ["grep", "-F", "-e", "lo", "-e", "pears"], ["grep", "-e", "nomatch"], ["grep", "-q", "UP"],
    ["grep", "-q", "nomatch"], ["grep", "-cv", "a"], ["grep", "-E", "(ab|ba)r"], ["grep", "\\(ab\\|ba\\)r"],
    ["grep", "-E", "a{2}"], ["grep", "ba*z"], ["grep", "*"], ["grep", "[]x]"], ["grep", "-in", "foo"],
    ["grep", "\\<up\\>"], ["grep", "-E", "p{1,2}"], ["grep", ""], ["grep", "-e", "UP", "a.txt", "b.txt"],
    ["grep", "-c", "beta", "a.txt", "b.txt"], ["grep", "end", "b.txt"], ["grep", "-h", "beta", "a.txt", "b.txt"],
    ["grep", "x", "missing.txt"], ["grep", "-s", "x", "missing.txt", "a.txt"],
    ["head"], ["head", "-n", "3"], ["head", "-3"], ["head", "-n3"], ["head", "-n", "-9"], ["head", "-n", "0"],
    ["head", "-n", "1", "a.txt", "b.txt"], ["head", "-n", "5", "b.txt"],
    ["tail"], ["tail", "-n", "2"], ["tail", "-2"], ["tail", "-n", "+10"], ["tail", "-n", "0"], ["tail", "-1", "b.txt"],
    ["wc"], ["wc", "-l"], ["wc", "-w"], ["wc", "-c"], ["wc", "-lw"], ["wc", "-l", "-c"], ["wc", "a.txt"],
    ["wc", "-l", "a.txt"], ["wc", "a.txt", "b.txt"], ["wc", "-w", "a.txt", "b.txt"], ["wc", "-l", "missing.txt"],
    ["sort"], ["sort", "-r"], ["sort", "-n"], ["sort", "-nr"], ["sort", "-u"], ["sort", "-n", "-u"],
    ["sort", "-rn", "-u"], ["sort", "b.txt", "a.txt"],
    ["cut", "-f", "2"], ["cut", "-d", " ", "-f", "1"], ["cut", "-d", " ", "-f", "2-"], ["cut", "-d ", "-f1,3"],
    ["cut", "-d", " ", "-f", "-2", "-s"], ["cut", "-d:", "-f", "1"], ["cut", "-d", " ", "-f", "3", "a.txt"],
    ["tr", "a-z", "A-Z"], ["tr", "[:lower:]", "[:upper:]"], ["tr", "-d", "0-9"], ["tr", "-s", " "],
    ["uniq"], ["uniq", "-c"], ["uniq", "-d"], ["uniq", "-u"], ["uniq", "-cd"], ["uniq", "b.txt"],
    ["uniq", "missing.txt"], ["tr", "\\t", ","], ["tr", "-s", "a-z", "x"], ["tr", "-ds", "\\n", " "],
    ["tr", "abc", "x"], ["tr", "-d"],
]


@pytest.fixture(scope="module")
def filedir(tmp_path_factory):
    where = tmp_path_factory.mktemp("filters")
    for name, content in _FILES.items():
        (where / name).write_bytes(content)
    return where


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a))
def test_filter_matches_the_real_tool_byte_for_byte(argv, filedir):
    real_tool = shutil.which(argv[0])
    if real_tool is None:
        pytest.skip(f"no real {argv[0]} on this machine to compare with")
    real = subprocess.run([real_tool] + argv[1:], input=_TEXT, capture_output=True, env=_C, cwd=filedir, timeout=10)
    out, err, status = coreutils.FILTERS[argv[0]](argv, _TEXT, _FILES.get)
    assert (out, status) == (real.stdout, real.returncode)
    if real.stderr:  # the same complaint (a missing file), or at least one
        assert err == real.stderr or (err and "emulated host" not in err.decode())
    else:
        assert err == b""


def test_a_filter_with_file_operands_never_reads_stdin():
    def stdin() -> bytes:
        raise AssertionError("read stdin although files were named")
    for name in ("grep", "head", "tail", "wc", "sort", "cut", "uniq"):
        argv = {"grep": ["grep", "a"], "cut": ["cut", "-f1"]}.get(name, [name]) + ["a.txt"]
        assert coreutils.FILTERS[name](argv, stdin, _FILES.get)[2] == 0


def test_an_option_outside_the_emulated_set_is_refused_not_ignored():
    for argv in (["grep", "-o", "a"], ["sort", "-k2"], ["wc", "-L"], ["cut", "-c1"], ["head", "-c", "3"]):
        out, err, status = coreutils.FILTERS[argv[0]](argv, b"a\n", _FILES.get)
        assert out == b"" and status in (1, 2) and b"not supported" in err, argv


# ---------------------------------------------------------------------------------------------------- pipes over SSH

PIPELINES = [  # (left side run on the emulated host, the filter the pipe feeds)
    ("ip -o link", ["grep", "-c", "UP"]),
    ("ip -o link", ["grep", "-v", "lo"]),
    ("ip -o link", ["cut", "-d:", "-f2"]),
    ("ls /sys/class/net", ["sort", "-r"]),
    ("rdma link", ["wc", "-l"]),
    ("ethtool ens1f0np0", ["grep", "-E", "Speed|Link detected"]),
    ("nvidia-smi --query-gpu=index,temperature.gpu --format=csv,noheader", ["sort", "-n", "-r"]),
    ("ibstat", ["head", "-n", "4"]),
    ("ibstat", ["tail", "-3"]),
    ("ip -o link", ["grep", "-q", "nomatch-anywhere"]),
]


@pytest.mark.parametrize("left,right", PIPELINES, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_a_pipe_feeds_the_left_sides_output_to_the_right_side(ssh, left, right):
    real_tool = shutil.which(right[0])
    if real_tool is None:
        pytest.skip(f"no real {right[0]} on this machine to compare with")
    alone = ssh.run(left, check=True).stdout.encode()
    piped = ssh.run(f"{left} | {' '.join(shlex.quote(w) for w in right)}")
    real = subprocess.run([real_tool] + right[1:], input=alone, capture_output=True, env=_C, timeout=10)
    assert (piped.stdout.encode(), piped.exit_status) == (real.stdout, real.returncode)


def test_three_stages_and_the_last_stages_status(ssh):
    assert ssh.run("ls /sys/class/net | grep -v lo | wc -l").stdout == "2\n"
    statuses = {c: ssh.run(c).exit_status for c in ("false | true", "true | false", "echo a | grep b",
                                                     "echo a | grep a", "no-such-tool | wc -l")}
    assert statuses == {"false | true": 0, "true | false": 1, "echo a | grep b": 1, "echo a | grep a": 0,
                        "no-such-tool | wc -l": 0}
    assert ssh.run("echo a | grep b; echo $?").stdout == "1\n"
    assert ssh.run("echo a | grep -q a && echo yes || echo no").stdout == "yes\n"


def test_the_first_stage_reads_the_sessions_stdin(ssh):
    assert ssh.run("cat | grep -n b | tail -1", stdin="a\nb\nc\nab\n").stdout == "4:ab\n"
    assert ssh.run("wc -c", stdin="12345").stdout == "5\n"


def test_a_streaming_command_is_refused_in_a_pipe(ssh):
    for command in ("ip monitor link | grep x", "sudo -n ip monitor | wc -l", "ip -ts -o monitor link | head -1",
                    "nvidia-smi --query-gpu=index --format=csv -lms 100 | head -1", "python3 - watch | wc -l"):
        result = ssh.run(command)
        assert result.exit_status == 2 and result.stdout == "", command
        assert result.stderr.startswith("sh: 1: emulated host: ") and "cannot run in a pipe" in result.stderr


def test_a_pipe_without_a_command_is_a_syntax_error(ssh):
    for command, message in (("ls |", "end of file unexpected"), ("| wc", '"|" unexpected')):
        result = ssh.run(command)
        assert (result.exit_status, result.stderr) == (2, f"sh: 1: Syntax error: {message}\n")


def test_unquoted_globs_expand_over_sysfs_and_files_quoted_ones_stay(ssh, bench, server):
    nics = bench.nic_ports(server.host_name)
    states = ssh.run("cat /sys/class/infiniband/*/ports/*/state", check=True).stdout
    assert states == "".join(ssh.run(f"cat /sys/class/infiniband/{n.rdma_dev}/ports/{n.rdma_port}/state").stdout
                             for n in sorted(nics, key=lambda n: (n.rdma_dev, n.rdma_port)))
    assert ssh.run("echo /sys/class/net/ens*").stdout.split() == \
        sorted(f"/sys/class/net/{n.netdev}" for n in nics if n.netdev.startswith("ens"))
    ssh.run("mkdir -p g && echo 1 > g/b1.log && echo 2 > g/a2.log && echo 3 > g/c.txt", check=True)
    assert ssh.run("echo g/*.log g/?.txt").stdout == "g/a2.log g/b1.log g/c.txt\n"
    assert ssh.run("cat g/*.log | sort -n").stdout == "1\n2\n"
    # nothing matches: the word itself (dash); quoted or escaped: literal, so grep gets its pattern
    assert ssh.run("echo g/*.none 'g/*.log' \"g/?\" g/\\*").stdout == "g/*.none g/*.log g/? g/*\n"
    assert ssh.run("cat g/*.log | grep -c '[12]*'").stdout == "2\n"


# ---------------------------------------------------------------------------------------------------- interactive


def _paramiko_client(server):
    client = paramiko.SSHClient()
    client.load_host_keys(str(server.known_hosts_path))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect("127.0.0.1", server.port, server.user, key_filename=str(server.client_key_path),
                   look_for_keys=False, allow_agent=False, timeout=10)
    return client


def _until_closed(channel) -> bytes:
    channel.settimeout(10)
    out = b""
    while data := channel.recv(65536):
        out += data
    return out


def test_interactive_shell_prompt_echo_editing_and_exit_status(server):
    prompt = f"{server.user}@{server.host_name}:~$ ".encode()
    with _paramiko_client(server) as client:
        channel = client.invoke_shell()  # pty-req (vt100) + shell, as a terminal user's ssh sends them
        channel.sendall(b"echo hi | wc -c\rfalsx\x7fe\recho $?\rec\x03echo $?\rnosuch\r\x1b[Aexit 3\r")
        transcript = _until_closed(channel)
        status = channel.recv_exit_status()
    assert transcript == (prompt + b"echo hi | wc -c\r\n3\r\n"
                          + prompt + b"falsx\b \be\r\n"
                          + prompt + b"echo $?\r\n1\r\n"
                          + prompt + b"ec^C\r\n"
                          + prompt + b"echo $?\r\n130\r\n"
                          + prompt + b"nosuch\r\n-bash: nosuch: command not found\r\n"
                          + prompt + b"exit 3\r\nlogout\r\n")
    assert status == 3


def test_interactive_ctrl_d_ends_with_the_last_status_and_streams_are_refused(server):
    with _paramiko_client(server) as client:
        channel = client.invoke_shell()
        channel.sendall(b"ip monitor link\rgrep -c x /no/such\r\x04")
        transcript = _until_closed(channel)
        assert channel.recv_exit_status() == 2
    assert b"-bash: emulated host: ip monitor streams until stopped" in transcript
    assert b"grep: /no/such: No such file or directory\r\n" in transcript  # stderr joins stdout under a pty
    assert transcript.endswith(b"logout\r\n")


def test_interactive_cd_moves_the_prompt_and_relative_paths(server):
    with _paramiko_client(server) as client:
        channel = client.invoke_shell()
        channel.sendall(b"mkdir -p w/d\rcd w\recho x > d/f\rcd /sys/class/net\rls | grep -c ens\rcd /nope\r"
                        b"cd\rcat w/d/f\rpwd\rexit\r")
        transcript = _until_closed(channel).decode()
    home = f"{server.user}@{server.host_name}:~"
    for expected in (f"{home}/w$ echo x > d/f\r\n", f"{server.user}@{server.host_name}:/sys/class/net$ ls | grep",
                     "\r\n2\r\n", "-bash: cd: /nope: No such file or directory\r\n", f"{home}$ cat w/d/f\r\nx\r\n",
                     f"pwd\r\n{server.home}\r\n"):
        assert expected in transcript, (expected, transcript)


def test_cd_lasts_for_its_command_line_only(ssh, server):
    assert ssh.run("cd /sys/class && ls net | wc -l && pwd").stdout == f"3\n/sys/class\n"
    assert ssh.run("pwd").stdout == f"{server.home}\n"  # each `ssh host COMMAND` is a new shell
    assert ssh.run("cd /tmp | true; pwd").stdout == f"{server.home}\n"  # a pipe's stage is a subshell
    missing = ssh.run("cd /nope")
    assert (missing.exit_status, missing.stderr) == (2, "sh: 1: cd: can't cd to /nope\n")


def test_a_command_without_a_pty_keeps_lf_and_with_one_gets_crlf(server):
    with _paramiko_client(server) as client:
        _, out, _ = client.exec_command("ls /sys/class/net")
        assert out.read() == b"ens1f0np0\nens2f0np0\nlo\n"
        _, out, _ = client.exec_command("ls /sys/class/net", get_pty=True)
        assert out.read() == b"ens1f0np0\r\nens2f0np0\r\nlo\r\n"


def _openssh(tool: str, server, port_flag: str = "-p") -> list[str]:
    return [tool, "-F", "/dev/null", "-i", str(server.client_key_path), "-o",
            f"UserKnownHostsFile={server.known_hosts_path}", "-o", "StrictHostKeyChecking=yes", "-o",
            "BatchMode=yes", "-o", "IdentitiesOnly=yes", port_flag, str(server.port)]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client binary on this machine")
def test_stock_openssh_client_gets_an_interactive_shell(server):
    prompt = f"{server.user}@{server.host_name}:~$ ".encode()
    done = subprocess.run(_openssh("ssh", server) + ["-tt", f"{server.user}@127.0.0.1"], timeout=60,
                          input=b"ls /sys/class/net | grep -c ens\ncat /no/such\n\x04", capture_output=True)
    assert done.stdout == (prompt + b"ls /sys/class/net | grep -c ens\r\n2\r\n"
                           + prompt + b"cat /no/such\r\ncat: /no/such: No such file or directory\r\n"
                           + prompt + b"logout\r\n")
    assert done.returncode == 1, done.stderr


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client binary on this machine")
def test_a_shell_without_a_pty_reads_its_commands_from_stdin(server):
    done = subprocess.run(_openssh("ssh", server) + ["-T", f"{server.user}@127.0.0.1"], timeout=60,
                          input=b"ls /sys/class/net | sort -r | head -1\nno-such-tool\nexit 4\necho never\n",
                          capture_output=True)
    assert (done.stdout, done.returncode) == (b"lo\n", 4)  # no prompt, no echo, LF line ends
    assert done.stderr == b"-bash: no-such-tool: command not found\n"


# ---------------------------------------------------------------------------------------------------- sftp, scp


def test_sftp_reads_writes_lists_and_renames_the_hosts_files(server, ssh, bench):
    nic = bench.nic_ports(server.host_name)[0]
    with _paramiko_client(server) as client, client.open_sftp() as sftp:
        assert sftp.normalize(".") == server.home
        sftp.mkdir("up")
        with sftp.open("up/a.txt", "w") as f:
            f.write(b"one\ntwo\n")
        assert ssh.run("cat ~/up/a.txt | wc -l").stdout == "2\n"  # the shell sees what SFTP wrote
        assert sftp.stat("up/a.txt").st_size == 8 and stat.S_ISDIR(sftp.stat("up").st_mode)
        sftp.rename("up/a.txt", "up/b.txt")
        assert sftp.listdir("up") == ["b.txt"]
        assert sftp.open("up/b.txt").read() == b"one\ntwo\n"
        carrier = sftp.open(f"/sys/class/net/{nic.netdev}/carrier").read()
        assert carrier.decode() == ssh.run(f"cat /sys/class/net/{nic.netdev}/carrier").stdout
        assert sorted(sftp.listdir("/sys/class/net")) == sorted(ssh.run("ls /sys/class/net").stdout.split())
        with pytest.raises(PermissionError):
            sftp.open(f"/sys/class/net/{nic.netdev}/carrier", "w")
        with pytest.raises(FileNotFoundError):
            sftp.open("no/such/dir/file", "w")
        with pytest.raises(FileNotFoundError):
            sftp.stat("missing")
        with pytest.raises(OSError):
            sftp.rmdir("up")  # not empty
        sftp.remove("up/b.txt")
        sftp.rmdir("up")
        assert "up" not in sftp.listdir(".")


@pytest.mark.skipif(shutil.which("sftp") is None or shutil.which("scp") is None, reason="no OpenSSH sftp/scp")
def test_stock_sftp_and_scp_clients_put_get_and_list(server, bench, tmp_path):
    nic = bench.nic_ports(server.host_name)[0]
    payload = os.urandom(300_000)
    (tmp_path / "up.bin").write_bytes(payload)
    batch = (f"mkdir batch\ncd batch\nput {tmp_path}/up.bin\nls\nls -l\nget up.bin {tmp_path}/down.bin\n"
             f"get /sys/class/infiniband/{nic.rdma_dev}/ports/{nic.rdma_port}/state {tmp_path}/state\n")
    done = subprocess.run(_openssh("sftp", server, "-P") + ["-b", "-", f"{server.user}@127.0.0.1"], timeout=60,
                          input=batch.encode(), capture_output=True)
    assert done.returncode == 0, done.stderr
    assert b"sftp> ls\nup.bin" in done.stdout
    # `ls -l` prints the server's long name: OpenSSH sftp-server's ls_file() line, owner by name
    (long,) = [line for line in done.stdout.decode().splitlines() if line.endswith(" up.bin") and line[0] == "-"]
    assert re.fullmatch(rf"-rw-r--r--    1 {server.user:<8} {server.user:<8}   300000 [A-Z][a-z]{{2}} [ 123]\d "
                        r"\d\d:\d\d up\.bin", long), long
    assert (tmp_path / "down.bin").read_bytes() == payload
    assert (tmp_path / "state").read_text().split(": ")[1].strip() == \
        bench.nic_snapshot(server.host_name, nic.netdev).ib_state
    # scp (OpenSSH >= 9 speaks SFTP): up to /tmp, back under another name
    remote = f"{server.user}@127.0.0.1:/tmp/scp.bin"
    up = subprocess.run(_openssh("scp", server, "-P") + [str(tmp_path / "up.bin"), remote], capture_output=True,
                        timeout=60)
    assert up.returncode == 0, up.stderr
    down = subprocess.run(_openssh("scp", server, "-P") + [remote, str(tmp_path / "back.bin")], capture_output=True,
                          timeout=60)
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back.bin").read_bytes() == payload
    missing = subprocess.run(_openssh("scp", server, "-P") + [f"{server.user}@127.0.0.1:/tmp/none", str(tmp_path)],
                             capture_output=True, timeout=60)
    assert missing.returncode == 1 and b"No such file" in missing.stderr


@pytest.mark.skipif(shutil.which("scp") is None, reason="no OpenSSH scp")
def test_legacy_scp_protocol_puts_and_gets_a_file(server, bench, tmp_path):
    nic = bench.nic_ports(server.host_name)[0]
    payload = os.urandom(70_000)
    (tmp_path / "up.bin").write_bytes(payload)
    scp = _openssh("scp", server, "-P") + ["-O"]  # -O: the rcp-style protocol, `scp -t`/`scp -f` on the host
    host = f"{server.user}@127.0.0.1"
    up = subprocess.run(scp + [str(tmp_path / "up.bin"), f"{host}:"], capture_output=True, timeout=60)
    assert up.returncode == 0, up.stderr
    down = subprocess.run(scp + [f"{host}:up.bin", f"{host}:/sys/class/net/{nic.netdev}/operstate", str(tmp_path)],
                          capture_output=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "up.bin").read_bytes() == payload
    assert (tmp_path / "operstate").read_text() == bench.nic_snapshot(server.host_name, nic.netdev).operstate + "\n"
    missing = subprocess.run(scp + [f"{host}:/tmp/none", str(tmp_path)], capture_output=True, timeout=60)
    assert missing.returncode == 1 and b"scp: /tmp/none: No such file or directory" in missing.stderr
    refused = subprocess.run(scp + [str(tmp_path / "up.bin"), f"{host}:/sys/class/net/{nic.netdev}/carrier"],
                             capture_output=True, timeout=60)
    assert refused.returncode == 1 and b"Permission denied" in refused.stderr


_ALPHABET = b"ab AB1 0.-\t_x"


@settings(max_examples=60)
@given(data=st.lists(st.binary(min_size=0, max_size=12).map(lambda b: bytes(_ALPHABET[c % len(_ALPHABET)] for c in b)),
                     max_size=8).map(lambda rows: b"\n".join(rows)),
       trailing=st.booleans(),
       argv=st.sampled_from([["sort"], ["sort", "-n"], ["sort", "-nr"], ["sort", "-nu"], ["sort", "-ru"],
                             ["wc"], ["wc", "-w"], ["grep", "-c", "a"], ["grep", "-iw", "a"], ["grep", "-xF", "ab"],
                             ["grep", "-nv", "[0-9]"], ["grep", "-E", "^-?[0-9]+(\\.[0-9]*)?"], ["tail", "-2"],
                             ["head", "-n", "-2"], ["cut", "-d", " ", "-f", "2-3"], ["tr", "-s", " a"],
                             ["tr", "a-z", "A-Z"], ["uniq", "-c"], ["uniq", "-u"]]))
def test_filters_agree_with_the_real_tools_on_generated_input(data, trailing, argv):
    """Generated lines of numbers, signs, dots, blanks and letters: where sort -n's and grep -w's rules bite."""
    real_tool = shutil.which(argv[0])
    if real_tool is None:
        pytest.skip(f"no real {argv[0]} on this machine to compare with")
    data += b"\n" if trailing and data else b""
    real = subprocess.run([real_tool] + argv[1:], input=data, capture_output=True, env=_C, timeout=10)
    out, _, status = coreutils.FILTERS[argv[0]](argv, data, _FILES.get)
    assert (out, status) == (real.stdout, real.returncode)
