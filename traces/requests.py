"""Inference-request importers: Azure LLM 2023 CSV, Mooncake JSONL, BurstGPT CSV and the canonical
schema (Parquet, CSV or JSONL). The format is detected from the file's content."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import TraceFormatError
from traces.schema import (MAX_TOKENS, REQUEST_COLUMNS, SYNC_WINDOW_COLUMNS, checked_file, parquet_kind,
                           read_parquet_frame, validate_requests)

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512


def detect_format(path: str | Path) -> str:
    """One of 'parquet', 'azure-csv', 'burstgpt-csv', 'canonical-csv', 'mooncake-jsonl',
    'canonical-jsonl', 'sync-windows-csv'; raises TraceFormatError when unknown."""
    path = checked_file(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror}", file=str(path)) from exc
    if head.startswith(b"PAR1"):
        return "parquet"
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip().lstrip("\ufeff")
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"invalid JSON: {exc.msg}", file=str(path), line=1) from exc
        if set(MOONCAKE_KEYS) <= keys:
            return "mooncake-jsonl"
        if set(REQUEST_COLUMNS) <= keys:
            return "canonical-jsonl"
        raise TraceFormatError(f"unknown JSON Lines trace (keys {sorted(keys)})", file=str(path), line=1)
    columns = [c.strip() for c in first.split(",")]
    if set(AZURE_COLUMNS) <= set(columns):
        return "azure-csv"
    if set(BURSTGPT_COLUMNS) <= set(columns):
        return "burstgpt-csv"
    if set(REQUEST_COLUMNS) <= set(columns):
        return "canonical-csv"
    if set(SYNC_WINDOW_COLUMNS) <= set(columns):
        return "sync-windows-csv"
    raise TraceFormatError(f"unknown trace format (header {first[:120]!r})", file=str(path), line=1)


def load_requests(path: str | Path) -> pd.DataFrame:
    """Load any supported request trace as the canonical frame: `arrival_s` (float, seconds from the
    trace's origin, non-decreasing), `prompt_tokens`, `output_tokens` (int64), and when the source has
    them `prefix_block_ids` (list of int) and `session_id`."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "azure-csv":
        return _load_azure(path)
    if fmt == "burstgpt-csv":
        return _load_burstgpt(path)
    if fmt == "mooncake-jsonl":
        return _load_jsonl(path, mooncake=True)
    if fmt == "canonical-jsonl":
        return _load_jsonl(path, mooncake=False)
    if fmt == "canonical-csv":
        frame = _read_csv(path)
        return validate_requests(frame, str(path))
    if fmt == "parquet":
        kind = parquet_kind(path)
        frame = read_parquet_frame(path)
        if kind not in (None, "requests") or not set(REQUEST_COLUMNS) <= set(frame.columns):
            raise TraceFormatError(f"Parquet file is not a request trace (kind {kind}, columns "
                                   f"{list(frame.columns)[:8]})", file=str(path))
        return validate_requests(frame, str(path))
    raise TraceFormatError(f"{fmt} is not a request trace", file=str(path))


def load_sync_windows(path: str | Path) -> pd.DataFrame:
    """DiLoCo sync windows `start_s, duration_s, bytes` from CSV or Parquet, validated."""
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "parquet":
        frame = read_parquet_frame(path)
        frame["_line"] = np.arange(1, len(frame) + 1)
    elif fmt == "sync-windows-csv":
        frame = _read_csv(path)
    else:
        raise TraceFormatError(f"not a sync-window trace ({fmt})", file=str(path))
    return validate_sync_windows(frame, str(path))


def validate_sync_windows(frame: pd.DataFrame, file: str) -> pd.DataFrame:
    for col in SYNC_WINDOW_COLUMNS:
        if col not in frame.columns:
            raise TraceFormatError(f"missing column {col!r}", file=file, line=1)
    lines = frame["_line"].to_numpy() if "_line" in frame.columns else np.arange(1, len(frame) + 1)
    values = {c: pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float) for c in SYNC_WINDOW_COLUMNS}
    checks = [
        (~np.isfinite(values["start_s"]) | (values["start_s"] < 0), "start_s must be a number >= 0"),
        (~np.isfinite(values["duration_s"]) | (values["duration_s"] <= 0), "duration_s must be > 0"),
        (~np.isfinite(values["bytes"]) | (values["bytes"] < 0), "bytes must be >= 0"),
    ]
    end = values["start_s"] + values["duration_s"]
    checks.append((np.r_[False, values["start_s"][1:] < end[:-1]], "windows must be sorted and not overlap"))
    for bad, message in checks:
        if bad.any():
            raise TraceFormatError(message, file=file, line=int(lines[np.flatnonzero(bad)[0]]))
    return pd.DataFrame({"start_s": values["start_s"], "duration_s": values["duration_s"],
                         "bytes": values["bytes"].astype(np.int64)})


# ---- readers -------------------------------------------------------------------------------------------

_PANDAS_LINE = re.compile(r"line (\d+)")


def _read_csv(path: Path, **kwargs) -> pd.DataFrame:
    """CSV as strings with a `_line` column (header = line 1); ragged rows become a file:line error."""
    try:
        frame = pd.read_csv(path, dtype=str, skipinitialspace=True, keep_default_na=False, **kwargs)
    except pd.errors.ParserError as exc:
        match = _PANDAS_LINE.search(str(exc))
        raise TraceFormatError(f"malformed CSV row ({str(exc).splitlines()[-1][:160]})", file=str(path),
                               line=int(match.group(1)) if match else None) from exc
    except (pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"unreadable CSV: {exc}", file=str(path)) from exc
    frame.columns = [c.strip() for c in frame.columns]
    # Lines are exact when no field spans lines (true of every format we accept).
    frame["_line"] = np.arange(2, len(frame) + 2)
    return frame


def _numeric(frame: pd.DataFrame, column: str, path: Path, integer: bool) -> np.ndarray:
    values = pd.to_numeric(frame[column].str.strip(), errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < 0)
    if integer:
        bad |= (values != np.round(values)) | (values > MAX_TOKENS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        kind = f"an integer in 0..{MAX_TOKENS}" if integer else "a number >= 0"
        raise TraceFormatError(f"{column} must be {kind}, got {frame[column].iloc[i]!r}",
                               file=str(path), line=int(frame["_line"].iloc[i]))
    return values


def _load_azure(path: Path) -> pd.DataFrame:
    frame = _read_csv(path)
    stamps = pd.to_datetime(frame["TIMESTAMP"].str.strip(), format="%Y-%m-%d %H:%M:%S.%f", errors="coerce")
    # Whole seconds may appear without a fraction; parse those separately.
    missing = stamps.isna()
    if missing.any():
        stamps[missing] = pd.to_datetime(frame.loc[missing, "TIMESTAMP"].str.strip(),
                                         format="%Y-%m-%d %H:%M:%S", errors="coerce")
    if stamps.isna().any():
        i = int(np.flatnonzero(stamps.isna().to_numpy())[0])
        raise TraceFormatError(f"TIMESTAMP must be 'YYYY-MM-DD HH:MM:SS.fffffff', got "
                               f"{frame['TIMESTAMP'].iloc[i]!r}", file=str(path), line=int(frame["_line"].iloc[i]))
    ns = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
    out = pd.DataFrame({
        "arrival_s": (ns - (ns[0] if len(ns) else 0)) / 1e9,
        "prompt_tokens": _numeric(frame, "ContextTokens", path, integer=True),
        "output_tokens": _numeric(frame, "GeneratedTokens", path, integer=True),
        "_line": frame["_line"].to_numpy(),
    })
    return validate_requests(out, str(path))


def _load_burstgpt(path: Path) -> pd.DataFrame:
    frame = _read_csv(path)
    out = pd.DataFrame({
        "arrival_s": _numeric(frame, "Timestamp", path, integer=False),
        "prompt_tokens": _numeric(frame, "Request tokens", path, integer=True),
        "output_tokens": _numeric(frame, "Response tokens", path, integer=True),
        "_line": frame["_line"].to_numpy(),
    })
    if "Session ID" in frame.columns:
        out["session_id"] = frame["Session ID"].str.strip().to_numpy()
    return validate_requests(out, str(path))


def _load_jsonl(path: Path, mooncake: bool) -> pd.DataFrame:
    arrival, prompt, output, blocks, sessions, lines = [], [], [], [], [], []
    keys = ("timestamp", "input_length", "output_length") if mooncake else REQUEST_COLUMNS
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceFormatError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", file=str(path),
                                       line=lineno) from None
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except (json.JSONDecodeError, RecursionError) as exc:
                raise TraceFormatError(f"invalid JSON: {getattr(exc, 'msg', 'nesting too deep')}", file=str(path),
                                       line=lineno) from None
            if not isinstance(record, dict) or any(k not in record for k in keys):
                raise TraceFormatError(f"record needs keys {list(keys)}", file=str(path), line=lineno)
            values = [record[k] for k in keys]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values) \
                    or not all(float(v).is_integer() for v in values[1:]):
                raise TraceFormatError(f"{', '.join(keys)} must be numbers >= 0 (tokens integer), got "
                                       f"{values}", file=str(path), line=lineno)
            ids = record.get("hash_ids" if mooncake else "prefix_block_ids")
            if ids is not None and not (isinstance(ids, list) and all(isinstance(b, int) for b in ids)):
                raise TraceFormatError("prefix block ids must be a list of integers", file=str(path), line=lineno)
            arrival.append(values[0] / 1000.0 if mooncake else float(values[0]))
            prompt.append(int(values[1]))
            output.append(int(values[2]))
            blocks.append(ids)
            sessions.append(record.get("session_id"))
            lines.append(lineno)
    out = pd.DataFrame({"arrival_s": np.asarray(arrival, dtype=float), "prompt_tokens": prompt,
                        "output_tokens": output, "_line": lines})
    if any(b is not None for b in blocks):
        out["prefix_block_ids"] = blocks
    if any(s is not None for s in sessions):
        out["session_id"] = sessions
    return validate_requests(out, str(path))


# ---- prompts ---------------------------------------------------------------------------------------------

# Ids every common vocabulary has (GPT-2 50k, Llama 32k), past the specials; all five digits wide, so a prompt's
# JSON text is built by numpy (each id "DDDDD," six bytes) rather than by formatting ints one at a time.
PROMPT_TOKEN_IDS = (10000, 30000)
_ID_WIDTH = 6


def _id_table() -> np.ndarray:
    """Row k: the bytes `DDDDD,` of id PROMPT_TOKEN_IDS[0] + k."""
    ids = np.arange(*PROMPT_TOKEN_IDS)
    out = np.empty((len(ids), _ID_WIDTH), dtype=np.uint8)
    out[:, 5] = ord(",")
    for k in range(4, -1, -1):
        ids, digit = np.divmod(ids, 10)
        out[:, k] = digit + ord("0")
    return out


# 120 kB, built once, one 6-byte item per id: a prompt's text is then one gather, not five divisions per id
_ID_TEXT = _id_table().view(f"V{_ID_WIDTH}").ravel()


def _ids_text(ids: np.ndarray) -> bytes:
    """`DDDDD,` for every id (five-digit ids), trailing comma included."""
    return _ID_TEXT[ids - PROMPT_TOKEN_IDS[0]].tobytes()


class PromptSynthesizer:
    """Distinct prompts of each request's exact length, as token ids, so a real server's prefix cache sees
    what the trace implies: a request with prefix block ids (Mooncake `hash_ids`, one per `block_tokens`
    tokens) is the concatenation of its blocks' contents, so requests sharing a block share that prefix;
    a request without them gets content of its own. Contents are seeded random ids: same seed, same prompts.
    `json_ids(i)` is the JSON array text (bytes) of request i. `prepare()` builds every request's own content
    and every block's in two draws (≈ 10 ns a token; a generator per request or block cost ~0.1 ms), so a
    replay calls it before its first deadline and its send path only slices."""

    def __init__(self, requests: pd.DataFrame, seed: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
        self.prompt_tokens = requests["prompt_tokens"].to_numpy(dtype=np.int64)
        self.blocks = (requests["prefix_block_ids"].tolist() if "prefix_block_ids" in requests.columns
                       else [None] * len(requests))
        self.seed, self.block_tokens = int(seed), int(block_tokens)
        self._block_text: dict[int, bytes] = {}
        self._own: bytes | None = None  # every request's own tokens, in index order (see prepare)
        self._own_start = np.empty(0, dtype=np.int64)

    def _draw(self, stream: int, n: int) -> bytes:
        return _ids_text(np.random.default_rng((self.seed, stream)).integers(*PROMPT_TOKEN_IDS, size=n))

    def _layout(self, index: int) -> tuple[list[int], int, int]:
        """(whole blocks, tokens of a cut last block, own tokens after them) of request `index`."""
        n, blocks = int(self.prompt_tokens[index]), self.blocks[index]
        if not blocks:
            return [], 0, n
        full, rest = divmod(n, self.block_tokens)
        whole = [int(b) for b in blocks[:full]]
        cut = rest if rest and len(blocks) > full else 0
        return whole, cut, n - len(whole) * self.block_tokens - cut

    def prepare(self) -> "PromptSynthesizer":
        if self._own is None:
            own = np.asarray([self._layout(i)[2] for i in range(len(self.prompt_tokens))], dtype=np.int64)
            self._own_start = np.r_[0, np.cumsum(own)] * _ID_WIDTH
            self._own = self._draw(1, int(own.sum()))
            used = sorted({int(b) for i, blocks in enumerate(self.blocks) if blocks
                           for b in blocks[: len(self._layout(i)[0]) + 1]})
            width = self.block_tokens * _ID_WIDTH
            text = self._draw(0, len(used) * self.block_tokens)
            self._block_text = {b: text[k * width:(k + 1) * width] for k, b in enumerate(used)}
        return self

    def json_ids(self, index: int) -> bytes:
        self.prepare()
        whole, cut, _ = self._layout(index)
        parts = [self._block_text[b] for b in whole]
        if cut:  # the last block, cut to the prompt's length
            parts.append(self._block_text[int(self.blocks[index][len(whole)])][: cut * _ID_WIDTH])
        parts.append(self._own[self._own_start[index]:self._own_start[index + 1]])  # may be empty
        return b"[" + b"".join(parts)[:-1] + b"]"

    def token_ids(self, index: int) -> list[int]:
        return json.loads(self.json_ids(index))
