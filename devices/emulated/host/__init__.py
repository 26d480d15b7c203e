"""An emulated lab host: a real SSH server (paramiko) on 127.0.0.1 answering what the drivers run.

Commands are answered from the `OpticalBench` in the real tools' formats (devices/emulated/formats.py); every
timestamp a host prints comes from `bench.host_clock_ns` / `bench.host_time` (offset + drift).

Command handlers form a registry (`server.commands`, name -> handler(ctx, argv) -> exit status), one module per
tool family, each with its `COMMANDS`:

- `server`: `EmulatedHostServer`, the registry and each session's start and end;
- `ssh`: SSH plumbing shared by every emulated SSH server (keys, transports, the accept/reap/command threads);
- `context`: `ExecContext`, what a handler sees (the channel's I/O, the working directory);
- `shell`: the mini shell (`&&`, `||`, `;`, pipes, `> FILE`, globs, the login shell, `sudo -n`, `python3`);
- `coreutils`: its pure filters (grep, head, tail, wc, sort, cut, uniq, tr), held to GNU's;
- `files`: the virtual files and the emulated sysfs (`cat`, `ls`, `mkdir`, ...);
- `transfer`: SFTP and legacy `scp`;
- `system`: `hostname`, `uname`, `date`, `chronyc`;
- `net`: `ip`, `rdma`, `ethtool`, `mlxlink` and the InfiniBand tools;
- `gpu`: `nvidia-smi`;
- `benchtools`: `alltoall_perf` (nccl-tests) and `ib_write_bw` (perftest) over the current circuits;
- `streams` and `agent`: the host agent protocol of ARCHITECTURE.md (upload with `mkdir -p … && cat > PATH`,
  `python3 -u PATH SUBCOMMAND`).
"""
