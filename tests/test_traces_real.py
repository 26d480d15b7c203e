"""The real public traces in ../shared/traces, checked against an independent pandas read."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
AZURE = SHARED / "azure-llm-2023"
MOONCAKE = SHARED / "mooncake-fast25" / "synthetic_trace.jsonl"

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces folder absent ({SHARED})")


@pytest.mark.parametrize("name", ["AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv"])
def test_azure_matches_independent_read(name):
    path = AZURE / name
    if not path.exists():
        pytest.skip(f"{path} absent")
    raw = pd.read_csv(path)
    stamps = pd.to_datetime(raw["TIMESTAMP"], format="ISO8601")
    frame = traces.load_requests(path)
    assert len(frame) == len(raw)
    span = (stamps.max() - stamps.min()).total_seconds()
    assert frame["arrival_s"].iloc[-1] - frame["arrival_s"].iloc[0] == pytest.approx(span, abs=1e-6)
    offsets = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy()
    np.testing.assert_allclose(frame["arrival_s"].to_numpy(), offsets, atol=1e-6)
    assert frame["prompt_tokens"].sum() == raw["ContextTokens"].sum()
    assert frame["output_tokens"].sum() == raw["GeneratedTokens"].sum()


def test_azure_rows_and_spans_as_documented():
    # The README's figures: 8,819 / 19,366 rows; spans 3,436 s and 3,502 s.
    code = traces.load_requests(AZURE / "AzureLLMInferenceTrace_code.csv")
    conv = traces.load_requests(AZURE / "AzureLLMInferenceTrace_conv.csv")
    assert (len(code), len(conv)) == (8819, 19366)
    assert round(code["arrival_s"].iloc[-1]) == 3436 and round(conv["arrival_s"].iloc[-1]) == 3502


def test_mooncake_matches_independent_read():
    if not MOONCAKE.exists():
        pytest.skip(f"{MOONCAKE} absent")
    raw = pd.read_json(MOONCAKE, lines=True)
    frame = traces.load_requests(MOONCAKE)
    assert len(frame) == len(raw) == 3993
    np.testing.assert_allclose(frame["arrival_s"].to_numpy(), raw["timestamp"].to_numpy() / 1000.0)
    assert frame["arrival_s"].iloc[-1] == pytest.approx(1022.025)
    assert frame["prompt_tokens"].sum() == raw["input_length"].sum()
    assert frame["output_tokens"].sum() == raw["output_length"].sum()
    blocks = frame["prefix_block_ids"].map(len).to_numpy()
    assert (blocks == np.ceil(raw["input_length"].to_numpy() / 512)).all()


def test_inspect_json_on_real_trace(capsys):
    from harness.cli import main
    import json

    path = AZURE / "AzureLLMInferenceTrace_conv.csv"
    assert main(["traces", "inspect", str(path), "--json", "--bin-s", "60"]) == 0
    stats = json.loads(capsys.readouterr().out)
    raw = pd.read_csv(path)
    assert stats["rows"] == len(raw)
    assert stats["prompt_tokens"]["sum"] == raw["ContextTokens"].sum()
    assert stats["output_tokens"]["max"] == raw["GeneratedTokens"].max()
    # Rates over 60 s bins times the bin width add back up to the row count.
    assert sum(stats["rate_per_s"]) * 60 == pytest.approx(len(raw))
