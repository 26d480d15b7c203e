"""MoE routing importers and the traffic model: per-rank expert token counts → all-to-all byte matrices
through an expert placement. Accepted layouts are described in docs/traces.md."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from traces.errors import TraceFormatError
from traces.schema import (MOE_HEADER_KEY, MOE_PHASES, MoeHeader, MoeTrace, checked_file, read_moe_parquet,
                           read_parquet_schema, read_parquet_table)

ROUTING_COLUMNS = ("iteration", "layer", "micro_batch", "src_rank", "expert", "tokens")
HARMOENY_DIST_COLUMN = "expert distribution"
MEGATRON_KEY = "num_global_tokens_per_expert"


class MoePhase(NamedTuple):
    iteration: int
    layer: int
    micro_batch: int
    phase: str
    matrix: np.ndarray  # n_ranks × n_ranks bytes, [src, dst]


def moe_phases(trace: MoeTrace) -> Iterator[MoePhase]:
    """All-to-all phases in execution order, each as an n×n bytes matrix [src, dst]. Order: iteration,
    then micro-batch (gradient accumulation: each micro-batch runs forward over layers 0..L-1, then
    backward over L-1..0), then phase. Pipeline schedules interleave differently; group as needed.
    Phases with no traffic rows are not yielded."""
    frame = trace.traffic
    if frame.empty:
        return
    n = trace.header.n_ranks
    is_bwd = frame["phase"].isin(["combine_bwd", "dispatch_bwd"]).to_numpy()
    phase_code = frame["phase"].cat.codes.to_numpy()
    layer = frame["layer"].to_numpy()
    # np.lexsort's last key is the primary one: (iteration, micro_batch, pass, ±layer, phase).
    order = np.lexsort((phase_code, np.where(is_bwd, -layer, layer), is_bwd, frame["micro_batch"].to_numpy(),
                        frame["iteration"].to_numpy()))
    keys = np.stack([frame["iteration"].to_numpy()[order], layer[order],
                     frame["micro_batch"].to_numpy()[order], phase_code[order]], axis=1)
    src, dst = frame["src_rank"].to_numpy()[order], frame["dst_rank"].to_numpy()[order]
    size = frame["bytes"].to_numpy()[order]
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
    ends = np.r_[starts[1:], len(order)]
    for lo, hi in zip(starts, ends):
        matrix = np.zeros((n, n), dtype=np.int64)
        np.add.at(matrix, (src[lo:hi], dst[lo:hi]), size[lo:hi])
        it, ly, mb, ph = (int(v) for v in keys[lo])
        yield MoePhase(it, ly, mb, MOE_PHASES[ph], matrix)


def traffic_from_routing(routing: pd.DataFrame, header: MoeHeader, backward: bool = True) -> pd.DataFrame:
    """Long routing counts (iteration, layer, micro_batch, src_rank, expert, tokens) → traffic rows.

    A token routed from rank s to expert e travels s → g·ep + placement[e], g = s // ep its EP group;
    dispatch carries it there and combine brings it back (same bytes, reversed). In the backward pass
    combine_bwd repeats dispatch's direction and dispatch_bwd repeats combine's."""
    placement = np.asarray(header.expert_placement, dtype=np.int64)
    src = routing["src_rank"].to_numpy(dtype=np.int64)
    expert = routing["expert"].to_numpy(dtype=np.int64)
    dst = (src // header.ep) * header.ep + placement[expert]
    forward = pd.DataFrame({
        "iteration": routing["iteration"].to_numpy(dtype=np.int64),
        "layer": routing["layer"].to_numpy(dtype=np.int64),
        "micro_batch": routing["micro_batch"].to_numpy(dtype=np.int64),
        "src_rank": src, "dst_rank": dst,
        "bytes": routing["tokens"].to_numpy(dtype=np.int64) * header.bytes_per_token,
    })
    forward = forward[forward["bytes"] > 0]
    keys = ["iteration", "layer", "micro_batch", "src_rank", "dst_rank"]
    out_dir = forward.groupby(keys, sort=False, as_index=False)["bytes"].sum()
    back_dir = out_dir.rename(columns={"src_rank": "dst_rank", "dst_rank": "src_rank"})
    parts = [out_dir.assign(phase="dispatch_fwd"), back_dir.assign(phase="combine_fwd")]
    if backward:
        parts += [out_dir.assign(phase="combine_bwd"), back_dir.assign(phase="dispatch_bwd")]
    return pd.concat(parts, ignore_index=True)


def counts_to_routing(counts: np.ndarray, iteration: np.ndarray, layer: np.ndarray, micro_batch: np.ndarray,
                      src_rank: np.ndarray) -> pd.DataFrame:
    """Wide counts (rows × experts) plus per-row keys → long routing frame (zero counts dropped)."""
    rows, experts = np.nonzero(counts)
    return pd.DataFrame({"iteration": iteration[rows], "layer": layer[rows], "micro_batch": micro_batch[rows],
                         "src_rank": src_rank[rows], "expert": experts, "tokens": counts[rows, experts]})


# ---- format detection and loading --------------------------------------------------------------------

def detect_moe_format(path: str | Path) -> str:
    """'canonical-parquet' | 'harmoeny' | 'flame' | 'megatron'."""
    path = Path(path)
    if path.is_dir():
        if any(path.glob("*/moe_layer-*.csv")) or any(path.glob("moe_layer-*.csv")):
            return "harmoeny"
        if any(path.glob("*.parquet")):
            return "flame"
        raise TraceFormatError("directory holds neither <rank>/moe_layer-<L>.csv (HarMoEny) nor *.parquet "
                               "(FLAME)", file=str(path))
    try:
        with open(checked_file(path), "rb") as fh:
            head = fh.read(65536)
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror}", file=str(path)) from exc
    if head.startswith(b"PAR1"):
        meta = read_parquet_schema(path).metadata or {}
        return "canonical-parquet" if MOE_HEADER_KEY in meta else "flame"
    text = head.decode("utf-8", "replace")
    if HARMOENY_DIST_COLUMN in text.split("\n", 1)[0]:
        return "harmoeny"
    if MEGATRON_KEY in text:
        return "megatron"
    raise TraceFormatError("unknown MoE trace format", file=str(path), line=1)


def load_moe(path: str | Path, *, hidden_size: int | None = None, dtype_bytes: int = 2, top_k: int | None = None,
             ep: int | None = None, num_experts: int | None = None, expert_placement: list[int] | None = None,
             ranks_per_server: int = 8, tp: int = 1, pp: int = 1, backward: bool = True,
             tokens_per_micro_batch: int | None = None, micro_batches: int = 1) -> MoeTrace:
    """Load a MoE trace. Canonical Parquet carries its own header; other layouts need `hidden_size`
    (bytes per token = hidden_size·dtype_bytes). FLAME needs `ep` and `tokens_per_micro_batch`."""
    path = Path(path)
    fmt = detect_moe_format(path)
    if fmt == "canonical-parquet":
        return read_moe_parquet(path)
    if hidden_size is None:
        raise TraceFormatError(f"{fmt} routing traces need hidden_size to turn tokens into bytes", file=str(path))
    if fmt == "harmoeny":
        routing, n_experts, n_ranks = _read_harmoeny(path)
        ep = ep or n_ranks
    elif fmt == "flame":
        if not ep or not tokens_per_micro_batch:
            raise TraceFormatError("FLAME per-token traces need ep and tokens_per_micro_batch (the files do "
                                   "not record ranks)", file=str(path))
        routing, n_experts, k = _read_flame(path, ep, tokens_per_micro_batch, micro_batches, num_experts)
        n_ranks, top_k = ep, top_k or k
    else:
        routing, n_experts, n_ranks = _read_megatron(path, ep)
        ep = ep or n_ranks
    n_experts = num_experts or n_experts
    if int(routing["expert"].to_numpy().max(initial=-1)) >= n_experts:
        raise TraceFormatError(f"expert id beyond num_experts {n_experts}", file=str(path))
    try:
        header = MoeHeader(num_experts=n_experts, top_k=top_k or 1, hidden_size=hidden_size,
                           dtype_bytes=dtype_bytes, ep=ep, tp=tp, pp=pp, ranks_per_server=ranks_per_server,
                           n_ranks=max(n_ranks, ep), expert_placement=tuple(expert_placement or ()))
    except ValueError as exc:
        raise TraceFormatError(str(exc), file=str(path)) from exc
    return MoeTrace(header, traffic_from_routing(routing, header, backward=backward))


def _last_int(name: str) -> int | None:
    found = re.findall(r"\d+", name)
    return int(found[-1]) if found else None


def _read_harmoeny(path: Path) -> tuple[pd.DataFrame, int, int]:
    if path.is_dir():
        files = sorted(path.glob("*/moe_layer-*.csv")) or sorted(path.glob("moe_layer-*.csv"))
    else:
        files = [path]
    frames, n_experts = [], None
    ranks = set()
    for file in files:
        rank = int(file.parent.name) if file.parent != path and file.parent.name.isdigit() else 0
        layer = _last_int(file.stem)
        if layer is None:
            raise TraceFormatError("file name must end in the layer number (moe_layer-<L>.csv)", file=str(file))
        try:
            table = pd.read_csv(file, dtype=str, keep_default_na=False, skipinitialspace=True)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise TraceFormatError(f"malformed CSV ({str(exc).splitlines()[-1][:160]})", file=str(file)) from exc
        table.columns = [c.strip() for c in table.columns]
        for col in ("iteration", HARMOENY_DIST_COLUMN):
            if col not in table.columns:
                raise TraceFormatError(f"missing column {col!r}", file=str(file), line=1)
        rows = []
        for i, (it, dist) in enumerate(zip(table["iteration"], table[HARMOENY_DIST_COLUMN])):
            line = i + 2
            try:
                counts = json.loads(dist)
                iteration = int(it)
            except (ValueError, TypeError) as exc:
                raise TraceFormatError(f"bad iteration or expert distribution ({exc})", file=str(file),
                                       line=line) from exc
            if not isinstance(counts, list) or not all(isinstance(c, int) and c >= 0 for c in counts):
                raise TraceFormatError("expert distribution must be a list of token counts >= 0", file=str(file),
                                       line=line)
            if n_experts is None:
                n_experts = len(counts)
            if len(counts) != n_experts:
                raise TraceFormatError(f"expert distribution has {len(counts)} entries, expected {n_experts}",
                                       file=str(file), line=line)
            rows.append((iteration, counts))
        if rows:
            counts = np.asarray([r[1] for r in rows], dtype=np.int64)
            its = np.asarray([r[0] for r in rows], dtype=np.int64)
            frames.append(counts_to_routing(counts, its, np.full(len(rows), layer), np.zeros(len(rows), np.int64),
                                            np.full(len(rows), rank)))
        ranks.add(rank)
    if not frames:
        raise TraceFormatError("no routing rows found", file=str(path))
    n_ranks = max(ranks) + 1
    return pd.concat(frames, ignore_index=True), int(n_experts), n_ranks


def _read_flame(path: Path, ep: int, tokens_per_micro_batch: int, micro_batches: int,
                num_experts: int | None) -> tuple[pd.DataFrame, int, int]:
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    frames, top_k, max_expert = [], None, -1
    per_iteration = ep * micro_batches * tokens_per_micro_batch
    for file in files:
        table = read_parquet_table(file)
        if "indices" not in table.column_names:
            raise TraceFormatError(f"FLAME layout needs an 'indices' column (top-k expert ids), got "
                                   f"{table.column_names[:8]}", file=str(file))
        if "layer" in table.column_names:
            layers = table.column("layer").to_numpy().astype(np.int64)
        else:
            layer = _last_int(file.stem)
            if layer is None:
                raise TraceFormatError("no 'layer' column and no layer number in the file name", file=str(file))
            layers = np.full(table.num_rows, layer, dtype=np.int64)
        lists = table.column("indices").combine_chunks()
        lengths = lists.value_lengths().to_numpy(zero_copy_only=False)
        k = int(lengths[0]) if len(lengths) else 0
        if np.any(lengths != k):
            row = int(np.flatnonzero(lengths != k)[0]) + 1
            raise TraceFormatError(f"every token needs the same top-k ({k}), row has {int(lengths[row - 1])}",
                                   file=str(file), line=row)
        top_k = top_k or k
        experts = lists.flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(-1, k)
        if (experts < 0).any() or (num_experts is not None and (experts >= num_experts).any()):
            row = int(np.flatnonzero(((experts < 0) | (experts >= (num_experts or 1 << 62))).any(axis=1))[0]) + 1
            raise TraceFormatError(f"expert id out of range [0, {num_experts})", file=str(file), line=row)
        max_expert = max(max_expert, int(experts.max(initial=-1)))
        # Token order assumption (the files do not say): iteration-major, then rank, then micro-batch.
        token = np.arange(len(experts))
        within = token % per_iteration
        frame = pd.DataFrame({
            "iteration": np.repeat(token // per_iteration, k),
            "layer": np.repeat(layers, k),
            "micro_batch": np.repeat((within // tokens_per_micro_batch) % micro_batches, k),
            "src_rank": np.repeat(within // (micro_batches * tokens_per_micro_batch), k),
            "expert": experts.ravel(), "tokens": 1})
        frames.append(frame.groupby(list(ROUTING_COLUMNS[:5]), as_index=False)["tokens"].sum())
    n_experts = num_experts or max_expert + 1
    return pd.concat(frames, ignore_index=True), n_experts, int(top_k or 1)


_KEY_INT = {name: re.compile(rf"\b{name}\b\s*[=:]?\s*(\d+)") for name in ("iteration", "layer", "micro_batch")}
_MEGATRON_LIST = re.compile(rf"{MEGATRON_KEY}\s*[=:]?\s*(\[.*\])")


def _read_megatron(path: Path, ep: int | None) -> tuple[pd.DataFrame, int, int]:
    rows = []  # (iteration, layer, micro_batch, 2-D counts)
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, text in enumerate(fh, 1):
            if MEGATRON_KEY not in text:
                continue
            try:
                if text.lstrip().startswith("{"):
                    record = json.loads(text)
                    keys = {k: record.get(k) for k in ("iteration", "layer", "micro_batch")}
                    counts = record[MEGATRON_KEY]
                else:
                    keys = {k: (int(m.group(1)) if (m := rx.search(text)) else None) for k, rx in _KEY_INT.items()}
                    match = _MEGATRON_LIST.search(text)
                    counts = json.loads(match.group(1)) if match else None
                array = np.asarray(counts, dtype=np.int64)
            except (ValueError, TypeError, KeyError) as exc:
                raise TraceFormatError(f"unparsable {MEGATRON_KEY} record ({exc})", file=str(path),
                                       line=lineno) from exc
            if keys["iteration"] is None or keys["layer"] is None:
                raise TraceFormatError(f"{MEGATRON_KEY} record without iteration and layer", file=str(path),
                                       line=lineno)
            if array.ndim == 1:
                if not ep:
                    raise TraceFormatError("1-D tokens-per-expert lists need ep to spread tokens over source "
                                           "ranks", file=str(path), line=lineno)
                # Spread global counts evenly over the EP ranks; remainders go to the lowest ranks.
                base, extra = np.divmod(array, ep)
                array = base[None, :] + (np.arange(ep)[:, None] < extra[None, :])
            if array.ndim != 2 or (array < 0).any():
                raise TraceFormatError("tokens per expert must be a list, or a list per source rank, of counts "
                                       ">= 0", file=str(path), line=lineno)
            if rows and array.shape != rows[0][3].shape:
                raise TraceFormatError(f"shape {array.shape} differs from earlier records {rows[0][3].shape}",
                                       file=str(path), line=lineno)
            rows.append((int(keys["iteration"]), int(keys["layer"]), int(keys["micro_batch"] or 0), array))
    if not rows:
        raise TraceFormatError(f"no {MEGATRON_KEY} records", file=str(path))
    n_src, n_experts = rows[0][3].shape
    counts = np.concatenate([r[3] for r in rows])
    rep = lambda i: np.repeat(np.asarray([r[i] for r in rows], dtype=np.int64), n_src)  # noqa: E731
    src = np.tile(np.arange(n_src, dtype=np.int64), len(rows))
    return counts_to_routing(counts, rep(0), rep(1), rep(2), src), n_experts, n_src
