"""Canonical trace schemas (Parquet on disk): inference requests, MoE all-to-all traffic, DiLoCo sync
windows. Importers in `traces.requests` / `traces.moe` produce these; everything else consumes them."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import TraceFormatError

REQUEST_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
REQUEST_OPTIONAL_COLUMNS = ("prefix_block_ids", "session_id")
SYNC_WINDOW_COLUMNS = ("start_s", "duration_s", "bytes")
MOE_COLUMNS = ("iteration", "layer", "micro_batch", "phase", "src_rank", "dst_rank", "bytes")
# Time order within one (iteration, layer, micro_batch): dispatch_fwd, combine_fwd, then in the backward
# pass combine_bwd (gradients travel token owner -> expert) before dispatch_bwd (expert -> token owner).
MOE_PHASES = ("dispatch_fwd", "combine_fwd", "combine_bwd", "dispatch_bwd")
MOE_HEADER_KEY = b"ocs_hil.moe_header"
KIND_KEY = b"ocs_hil.kind"


@dataclass(frozen=True)
class MoeHeader:
    """Model and parallelism context of a MoE traffic trace.

    Ranks 0..n_ranks-1 form consecutive expert-parallel groups of `ep` ranks (a MixNet region when
    ep·tp GPUs share one OCS); all-to-all traffic stays inside a group. `expert_placement[e]` is the
    EP-group-local rank hosting expert e. Bytes per routed token = hidden_size · dtype_bytes."""

    num_experts: int
    top_k: int
    hidden_size: int
    dtype_bytes: int
    ep: int
    tp: int = 1
    pp: int = 1
    ranks_per_server: int = 8
    n_ranks: int = 0
    expert_placement: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        n_ranks = self.n_ranks or self.ep
        object.__setattr__(self, "n_ranks", int(n_ranks))
        placement = tuple(int(r) for r in self.expert_placement) or default_placement(self.num_experts, self.ep)
        object.__setattr__(self, "expert_placement", placement)
        for name in ("num_experts", "top_k", "hidden_size", "dtype_bytes", "ep", "tp", "pp", "ranks_per_server"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"MoE header: {name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoE header: top_k {self.top_k} > num_experts {self.num_experts}")
        if self.n_ranks % self.ep:
            raise ValueError(f"MoE header: n_ranks {self.n_ranks} is not a multiple of ep {self.ep}")
        if len(placement) != self.num_experts or not all(0 <= r < self.ep for r in placement):
            raise ValueError(f"MoE header: expert_placement needs {self.num_experts} ranks in [0, {self.ep})")

    @property
    def bytes_per_token(self) -> int:
        return self.hidden_size * self.dtype_bytes

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "MoeHeader":
        data = json.loads(text)
        data["expert_placement"] = tuple(data.get("expert_placement", ()))
        return cls(**data)


def default_placement(num_experts: int, ep: int) -> tuple[int, ...]:
    """Contiguous blocks: experts [k·E/ep, (k+1)·E/ep) on EP rank k (Megatron's layout)."""
    return tuple(int(e * ep // num_experts) for e in range(num_experts))


@dataclass
class MoeTrace:
    """All-to-all traffic: one row per (iteration, layer, micro_batch, phase, src_rank, dst_rank) with
    bytes > 0 (zero entries are omitted). The diagonal (src == dst) is local copy, kept for completeness.
    `regime_changes` holds ground-truth change iterations when the trace was generated."""

    header: MoeHeader
    traffic: pd.DataFrame
    regime_changes: tuple[int, ...] = ()

    def __post_init__(self):
        self.traffic = normalise_moe_frame(self.traffic)
        t, n = self.traffic, self.header.n_ranks
        for col in ("src_rank", "dst_rank"):
            bad = (t[col] < 0) | (t[col] >= n)
            if bad.any():
                raise ValueError(f"MoE traffic: {col} {int(t.loc[bad, col].iloc[0])} outside the trace's ranks 0..{n - 1}")

    @property
    def iterations(self) -> np.ndarray:
        return np.unique(self.traffic["iteration"].to_numpy())


def normalise_moe_frame(frame: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in MOE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"MoE traffic lacks columns {missing}")
    out = frame.loc[:, list(MOE_COLUMNS)].copy()
    for col in ("iteration", "layer", "micro_batch", "src_rank", "dst_rank", "bytes"):
        values = pd.to_numeric(out[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) | (values < 0) | (values != np.round(values)) | (values >= 2**63)
        if bad.any():
            raise ValueError(f"MoE traffic: {col} must be an integer >= 0 within 64 bits, found "
                             f"{out[col].iloc[int(np.flatnonzero(bad)[0])]!r}")
        out[col] = out[col].astype(np.int64)
    phase = out["phase"].astype(str)
    if not phase.isin(MOE_PHASES).all():
        raise ValueError(f"MoE traffic has phases outside {MOE_PHASES}: {sorted(set(phase) - set(MOE_PHASES))}")
    out["phase"] = pd.Categorical(phase, categories=list(MOE_PHASES))
    out = out.sort_values(["iteration", "layer", "micro_batch", "phase", "src_rank", "dst_rank"],
                          kind="stable").reset_index(drop=True)
    return out


MAX_TOKENS = 2**31 - 1  # far beyond any context or output length; bigger values are corrupt, not requests
MAX_ARRIVAL_S = 1e9  # 31 years; nanosecond times stay within int64


def validate_requests(frame: pd.DataFrame, file: str) -> pd.DataFrame:
    """Check and type a request frame. A `_line` column, if present, gives each row's line in `file`."""
    for col in REQUEST_COLUMNS:
        if col not in frame.columns:
            raise TraceFormatError(f"missing column {col!r}", file=file, line=1)
    arrival = pd.to_numeric(frame["arrival_s"], errors="coerce").to_numpy(dtype=float)
    _raise_first(~np.isfinite(arrival), frame, file, "arrival_s must be a finite number")
    decreasing = np.r_[False, np.diff(arrival) < 0]
    _raise_first(decreasing, frame, file, "arrival_s decreases (requests must be time-sorted)")
    _raise_first(arrival < 0, frame, file, "arrival_s must be >= 0")
    _raise_first(arrival > MAX_ARRIVAL_S, frame, file, f"arrival_s must be <= {MAX_ARRIVAL_S:g} s")
    for col in ("prompt_tokens", "output_tokens"):
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) | (values < 0) | (values != np.round(values)) | (values > MAX_TOKENS)
        _raise_first(bad, frame, file, f"{col} must be an integer in 0..{MAX_TOKENS}")
    if "prefix_block_ids" in frame.columns:  # ids are hashes: any int64, nothing beyond
        bad = np.array([b is not None and not all(isinstance(i, (int, np.integer)) and -2**63 <= i < 2**63
                                                    for i in b) for b in frame["prefix_block_ids"]], dtype=bool)
        _raise_first(bad, frame, file, "prefix block ids must be 64-bit integers")
    out = frame.copy()
    out["arrival_s"] = arrival
    out["prompt_tokens"] = out["prompt_tokens"].astype(np.int64)
    out["output_tokens"] = out["output_tokens"].astype(np.int64)
    return out.drop(columns="_line", errors="ignore").reset_index(drop=True)


def _raise_first(bad: np.ndarray, frame: pd.DataFrame, file: str, message: str) -> None:
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        line = int(frame["_line"].iloc[i]) if "_line" in frame.columns else i + 1
        raise TraceFormatError(message, file=file, line=line)


# ---- Parquet I/O -------------------------------------------------------------------------------------

def write_requests(frame: pd.DataFrame, path: str | Path) -> None:
    cols = [c for c in REQUEST_COLUMNS + REQUEST_OPTIONAL_COLUMNS if c in frame.columns]
    table = pa.Table.from_pandas(frame.loc[:, cols], preserve_index=False)
    _write(table, path, b"requests")


def write_sync_windows(frame: pd.DataFrame, path: str | Path) -> None:
    table = pa.Table.from_pandas(frame.loc[:, list(SYNC_WINDOW_COLUMNS)], preserve_index=False)
    _write(table, path, b"sync_windows")


def write_moe(trace: MoeTrace, path: str | Path) -> None:
    frame = trace.traffic.copy()
    frame["phase"] = frame["phase"].astype(str)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = {MOE_HEADER_KEY: trace.header.to_json().encode(),
            b"ocs_hil.regime_changes": json.dumps(list(trace.regime_changes)).encode()}
    _write(table, path, b"moe", meta)


def _write(table: pa.Table, path: str | Path, kind: bytes, extra: dict | None = None) -> None:
    meta = dict(table.schema.metadata or {})
    meta[KIND_KEY] = kind
    meta.update(extra or {})
    pq.write_table(table.replace_schema_metadata(meta), str(path))


# The largest trace file read (a day of a busy serving trace is ~1 GB of CSV); larger is refused before reading.
MAX_TRACE_BYTES = 8 * 2**30


def checked_file(path: str | Path) -> Path:
    """`path` if it is a regular file no larger than MAX_TRACE_BYTES, else TraceFormatError — before anything
    is read (a FIFO would block the read, /dev/zero never end it)."""
    import os
    import stat

    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    if not stat.S_ISREG(info.st_mode):
        raise TraceFormatError("not a regular file (a device, FIFO or socket is never read as a trace)",
                               file=str(path))
    if info.st_size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{info.st_size} bytes: larger than the {MAX_TRACE_BYTES}-byte limit of a trace",
                               file=str(path))
    return path


def _parquet(what, path: str | Path):
    """`what(path)` (a pyarrow read), any failure of a damaged file as TraceFormatError."""
    path = checked_file(path)
    try:
        return what(str(path))
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        raise TraceFormatError(f"damaged or unreadable Parquet file: {str(exc)[:200]}", file=str(path)) from None


def read_parquet_schema(path: str | Path) -> pa.Schema:
    return _parquet(pq.read_schema, path)


def read_parquet_table(path: str | Path) -> pa.Table:
    """The one checked Parquet reader of the importers: a regular file within the size limit, read whole."""
    return _parquet(pq.read_table, path)


def read_parquet_frame(path: str | Path) -> pd.DataFrame:
    """`read_parquet_table` as pandas; a column type pandas cannot take is the file's fault too."""
    table = read_parquet_table(path)
    return _parquet(lambda _: table.to_pandas(), path)


def parquet_kind(path: str | Path) -> str | None:
    """'requests' | 'moe' | 'sync_windows' for files this project wrote, else None."""
    meta = read_parquet_schema(path).metadata or {}
    kind = meta.get(KIND_KEY)
    try:
        return kind.decode() if kind else None
    except UnicodeDecodeError:
        raise TraceFormatError("Parquet file's kind tag is not text", file=str(path)) from None


def read_moe_parquet(path: str | Path) -> MoeTrace:
    table = read_parquet_table(path)
    meta = table.schema.metadata or {}
    if MOE_HEADER_KEY not in meta:
        raise TraceFormatError("Parquet file has no MoE header metadata (not a canonical MoE trace)",
                               file=str(path))
    try:
        header = MoeHeader.from_json(meta[MOE_HEADER_KEY])
        changes = tuple(json.loads(meta.get(b"ocs_hil.regime_changes", b"[]")))
        return MoeTrace(header, table.to_pandas(), changes)
    except (ValueError, TypeError, KeyError, AttributeError, pa.ArrowException) as exc:
        raise TraceFormatError(f"bad MoE trace: {str(exc)[:200]}", file=str(path)) from None
