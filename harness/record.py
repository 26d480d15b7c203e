"""Run directory helpers: atomic JSON, the manifest, summaries, and an immutable run record handed to
pluggable writers (OpenHTF-style output callbacks). See docs/records.md."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

MANIFEST_FORMAT = 1
PACKAGES = ("ocs-hil", "numpy", "pandas", "pyarrow", "scipy", "paramiko", "pyserial", "pyyaml", "scapy",
            "matplotlib", "aiohttp", "cryptography")
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def utc_stamp(when: datetime | None = None) -> str:
    return (when or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(out: str | os.PathLike, playbook_name: str, *, when: datetime | None = None) -> Path:
    """Create and return `out/<UTC timestamp>-<playbook>` (with -2, -3... if that exists already)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", playbook_name).strip("._") or "run"
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = f"{utc_stamp(when)}-{name}"
    for attempt in range(1, 1000):
        path = out / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"too many runs named {base} in {out}")


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types: mappings, dataclasses, numpy scalars/arrays, paths; NaN/inf become null."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.repr}  # repr=False fields (e.g. passwords) stay out
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj) if isinstance(obj, (set, frozenset)) else obj
        return [to_jsonable(v) for v in items]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy scalar or array
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write JSON so that readers see the old file or the new one, never a partial one."""
    path = Path(path)
    text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n"
    write_text_atomic(path, text)
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_describe(root: Path = PROJECT_ROOT) -> str | None:
    """`git describe --always --dirty` of the project checkout, or None outside a git checkout."""
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def sha256_text(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def build_manifest(playbook: Any, *, inventory_text: str | bytes | None = None, profile: Any = None,
                   seed: int | None = None, clock_table: Any = None, extra: Mapping | None = None) -> dict:
    """What a run needs to be reproduced: inputs by hash, seed, software versions, clock corrections.

    `playbook` is a harness.config.Playbook (name, source, sha256, bench, cycles). Only the inventory's
    hash is kept (its text names hosts; secrets never are in it, see password_env).
    """
    return to_jsonable({
        "format": MANIFEST_FORMAT,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "playbook": {"name": getattr(playbook, "name", None), "source": getattr(playbook, "source", None),
                     "sha256": getattr(playbook, "sha256", None), "bench": getattr(playbook, "bench", None),
                     "cycles": getattr(playbook, "cycles", None)},
        "inventory": None if inventory_text is None else {"sha256": sha256_text(inventory_text)},
        "profile": profile,
        "seed": seed if seed is not None else getattr(playbook, "seed", None),
        "clock": clock_table,
        "versions": {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
                     "platform": platform.platform(), "packages": package_versions()},
        "git": git_describe(),
        "extra": dict(extra or {}),
    })


# --------------------------------------------------------------------------------------- summary
_SUMMARY_ROWS = (("ocs_switch", "OCS switch (completed − sent)"),
                 ("turnaround", "turnaround (max first_packet − sent)"))


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, (list, tuple)):
        return f"[{_fmt(v[0])}, {_fmt(v[1])}]"
    if isinstance(v, int):
        return str(v)
    return f"{v:.6g}"


def p99_column(stats: list[Mapping]) -> tuple[str, str | None]:
    """The p99 interval column's head, and the one note a report prints instead of "needs N cycles" on every row:
    a two-sided interval of a p99 needs hundreds of cycles; until every row has one the column holds the one-sided
    lower bound the cycles support."""
    if any(s.get("p99_ci95") for s in stats):
        return "p99 95% CI", None
    needs = next((s.get("p99_needs_cycles") for s in stats if s.get("p99_needs_cycles")), None)
    note = None if needs is None else (f"A two-sided 95 % interval of a p99 needs ≥ {needs} cycles; the p99 ≥ "
                                       "column gives the one-sided 95 % lower bound the cycles support.")
    return "p99 ≥ (95 %)", note


def p99_cell(s: Mapping, head: str, value=lambda v: f"{v:.3f}") -> str:
    if s.get("p99_ci95"):
        return f"{value(s['p99_ci95'][0])}–{value(s['p99_ci95'][1])}"
    lower = (s.get("p99_bound95") or {}).get("lower")
    return "–" if lower is None else (f"≥ {value(lower)}" if head == "p99 95% CI" else value(lower))


def summary_markdown(summary: Mapping, title: str = "Run summary") -> str:
    """A markdown table from analysis.stats.summarize_events output (times in ms, 3 decimals: µs)."""
    from analysis.stats import MIN_MEAN_UNITS, CHAIN

    rows: list[tuple[str, Mapping]] = []
    for key, label in _SUMMARY_ROWS:
        if key in summary:
            rows.append((label, summary[key]))
    for stage, s in (summary.get("stages") or {}).items():
        if not (stage == "ocs_command_completed" and "ocs_switch" in summary):  # the OCS switch row, once
            rows.append((f"{stage} (after sent)", s))
    for name, s in (summary.get("chain") or {}).items():
        rows.append((f"chain: {name}", s))
    ms = summary.get("unit_scale", 1e-6) == 1e-6
    unit = "ms" if ms else f"×{summary.get('unit_scale')} ns"

    def value(v: Any) -> str:
        return _fmt(v) if not ms or v is None or not isinstance(v, float) or not math.isfinite(v) else f"{v:.3f}"

    def mean_ci(s: Mapping) -> str:
        ci = s.get("mean_ci95")
        return f"{value(ci[0])}–{value(ci[1])}" if ci else f"needs ≥ {MIN_MEAN_UNITS} cycles" if s.get("n") else "–"

    head, note = p99_column([s for _, s in rows])
    lines = [f"# {title}", ""]
    if "cycles" in summary:
        lines += [f"Cycles: {summary['cycles']}", ""]
    if note:
        lines += [note, ""]
    lines += [f"| delay ({unit}) | n | cycles | mean | p50 | p90 | p99 | max | mean 95% CI | {head} |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for label, s in rows:
        p99 = p99_cell(s, head, value)
        lines.append(f"| {label} | {_fmt(s.get('n'))} | {_fmt(s.get('n_cycles'))} | {value(s.get('mean'))} | "
                     f"{value(s.get('p50'))} | {value(s.get('p90'))} | {value(s.get('p99'))} | {value(s.get('max'))} | "
                     f"{mean_ci(s)} | {p99} |")
    backwards = [name for name, s in (summary.get("chain") or {}).items()
                 if isinstance(s.get("mean"), float) and s["mean"] < 0]
    for name in backwards:
        later, earlier = CHAIN[name]
        lines += ["", f"chain: {name} is negative: {later} was seen before {earlier} (each dated within its bound). "
                  + ("Light reached the receivers before the switch reported the command complete: a switch "
                     "replies after its last mirror settles, and the reply takes its own time to arrive."
                     if earlier == "ocs_command_completed" else
                     "The two stages are closer than their bounds, so their order is not resolved.")]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ record + writers
def _freeze(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return tuple(_freeze(v) for v in obj)
    return obj


@dataclass(frozen=True)
class RunRecord:
    """Everything about a finished run, frozen. Writers turn it into files."""

    run_id: str
    run_dir: Path
    playbook: str
    outcome: str  # "completed" | "failed" | "aborted"
    started_utc: str
    ended_utc: str
    manifest: Mapping = field(default_factory=dict)
    summary: Mapping = field(default_factory=dict)
    error: str | None = None
    artifacts: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        object.__setattr__(self, "manifest", _freeze(self.manifest))
        object.__setattr__(self, "summary", _freeze(self.summary))
        object.__setattr__(self, "artifacts", tuple(self.artifacts))


Writer = Callable[[RunRecord], Any]


def write_manifest(record: RunRecord) -> Path:
    return write_json_atomic(record.run_dir / "manifest.json", record.manifest)


# summary.json and verdict.json follow schemas/summary.schema.json and schemas/verdict.schema.json: fields are only
# added within a version; a removal or a change of meaning raises it.
RECORD_SCHEMA_VERSION = 1


def write_summary_json(record: RunRecord) -> Path:
    return write_json_atomic(record.run_dir / "summary.json", {
        "schema_version": RECORD_SCHEMA_VERSION, "run_id": record.run_id, "playbook": record.playbook, "outcome": record.outcome,
        "started_utc": record.started_utc, "ended_utc": record.ended_utc, "error": record.error,
        "artifacts": record.artifacts, "summary": record.summary})


def write_summary_md(record: RunRecord) -> Path:
    text = summary_markdown(record.summary, title=f"Run {record.run_id}")
    head = f"Playbook `{record.playbook}` — outcome **{record.outcome}** ({record.started_utc} → {record.ended_utc})\n"
    if record.error:
        head += f"\nError: {record.error}\n"
    body = text.split("\n", 2)
    return write_text_atomic(record.run_dir / "summary.md", "\n".join([body[0], "", head, body[2]]))


DEFAULT_WRITERS: tuple[Writer, ...] = (write_manifest, write_summary_json, write_summary_md)


class RecordWriteError(RuntimeError):
    """One or more writers failed; the others still ran."""


def publish(record: RunRecord, writers: Iterable[Writer] = DEFAULT_WRITERS) -> None:
    """Run every writer on the record; a failing writer does not stop the rest."""
    failures = []
    for writer in writers:
        try:
            writer(record)
        except Exception as exc:  # noqa: BLE001 - collected and re-raised below
            failures.append(f"{getattr(writer, '__name__', writer)!s}: {exc}")
    if failures:
        raise RecordWriteError("run record writers failed: " + "; ".join(failures))
