"""NVIDIA aiperf as an independent load generator (the optional extra `aiperf`): replay a Mooncake trace
against an OpenAI-compatible endpoint with a tokenizer built here, with no model hub.

aiperf resolves `--tokenizer` through the Hugging Face hub. Its dataset workers force the hub's offline mode
and then accept only a cached repository, not a folder path, so the tokenizer is written as a cached
repository (`HF_HOME/hub/models--local--NAME/snapshots/…`) and aiperf runs with `HF_HUB_OFFLINE=1`.
The tokenizer is word-level: one token per whitespace-separated word, as the emulated vLLM endpoint counts a
text prompt, and its output tokens (" t") are words of it, so aiperf's sequence lengths are the endpoint's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

TOKENIZER_REPO = "local/word-tokenizer"
_SNAPSHOT = "0" * 40


def aiperf_command() -> list[str] | None:
    """How to start aiperf: this interpreter's module, else the executable `OCS_HIL_AIPERF` names (aiperf in an
    environment of its own: it pins pandas 2.3, orjson 3.11 and rich 14), else `aiperf` on PATH; None if none."""
    import importlib.util

    if importlib.util.find_spec("aiperf") is not None:
        return [sys.executable, "-m", "aiperf"]
    named = os.environ.get("OCS_HIL_AIPERF") or shutil.which("aiperf")
    return [named] if named and Path(named).is_file() else None


def write_word_tokenizer(hf_home: Path, words: int = 1000) -> str:
    """A word-level tokenizer (the `tokenizers` library) saved as the cached hub repository TOKENIZER_REPO
    under `hf_home`; returns the name to give `--tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {word: i for i, word in enumerate(["[UNK]", "t", *(f"w{k}" for k in range(words - 2))])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # decode joins the words with spaces
    repo = Path(hf_home) / "hub" / f"models--{TOKENIZER_REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / _SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_SNAPSHOT)
    tokenizer.save(str(snapshot / "tokenizer.json"))
    (snapshot / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1 << 20}))
    return TOKENIZER_REPO


def run_aiperf(command: list[str], url: str, model: str, mooncake: Path, out_dir: Path, hf_home: Path,
               timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """`aiperf profile` replaying the Mooncake trace on its own timestamps (fixed schedule), streaming, on
    /v1/completions; artefacts in out_dir. Raises CalledProcessError with aiperf's output on failure."""
    tokenizer = write_word_tokenizer(hf_home)
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [*command, "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
            "--input-file", str(mooncake), "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
            "--tokenizer", tokenizer, "--output-artifact-dir", str(out_dir), "--ui-type", "none",
            "--workers-max", "2", "--no-server-metrics", "--no-gpu-telemetry"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
    return done


def aiperf_records(out_dir: Path) -> pd.DataFrame:
    """aiperf's per-request records (`profile_export.jsonl`), one row per request in send order: start_ns
    (aiperf's request_start_ns), and its per-request metrics (ms or tokens, by aiperf's tag)."""
    rows = []
    for line in (Path(out_dir) / "profile_export.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        row = {"start_ns": item["metadata"]["request_start_ns"]}
        row.update({tag: m["value"] for tag, m in (item.get("metrics") or {}).items()
                    if isinstance(m, dict) and not isinstance(m.get("value"), list)})
        rows.append(row)
    return pd.DataFrame(rows).sort_values("start_ns").reset_index(drop=True)


def aiperf_summary(out_dir: Path) -> dict:
    """aiperf's aggregate export (`profile_export_aiperf.json`): metric tag → {unit, avg, p50, p99, …}."""
    return json.loads((Path(out_dir) / "profile_export_aiperf.json").read_text())
