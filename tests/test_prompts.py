"""Synthesised replay prompts: exact lengths, distinct contents, shared prefixes exactly where the trace's
prefix block ids (Mooncake `hash_ids`) are shared, same seed same prompts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces.requests import PROMPT_TOKEN_IDS, PromptSynthesizer, load_requests

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake-fast25" / "synthetic_trace.jsonl"


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def test_lengths_exact_and_contents_distinct_without_blocks():
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [5, 700, 700], "output_tokens": [1, 1, 1]})
    synth = PromptSynthesizer(frame, seed=3)
    ids = [synth.token_ids(i) for i in range(3)]
    assert [len(x) for x in ids] == [5, 700, 700]
    assert all(PROMPT_TOKEN_IDS[0] <= t < PROMPT_TOKEN_IDS[1] for x in ids for t in x)
    assert _common_prefix(ids[1], ids[2]) < 3  # same length, unrelated contents
    assert PromptSynthesizer(frame, seed=3).token_ids(1) == ids[1]
    assert PromptSynthesizer(frame, seed=4).token_ids(1) != ids[1]


def test_shared_blocks_share_exactly_their_tokens():
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "prompt_tokens": [1100, 1300, 600, 40],
                          "output_tokens": [1] * 4,
                          "prefix_block_ids": [[7, 8, 9], [7, 8, 10], [7, 11], [7]]})
    synth = PromptSynthesizer(frame, block_tokens=512)
    ids = [synth.token_ids(i) for i in range(4)]
    assert [len(x) for x in ids] == [1100, 1300, 600, 40]
    assert _common_prefix(ids[0], ids[1]) == 1024  # blocks 7, 8 shared; 9 vs 10 differ
    assert _common_prefix(ids[0], ids[2]) == 512
    assert ids[3] == ids[0][:40]  # a prompt shorter than its one block is that block's start


def test_more_tokens_than_blocks_cover_gets_its_own_tail():
    frame = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [600, 600], "output_tokens": [1, 1],
                          "prefix_block_ids": [[1], [1]]})
    synth = PromptSynthesizer(frame, block_tokens=512)
    a, b = synth.token_ids(0), synth.token_ids(1)
    assert len(a) == len(b) == 600 and _common_prefix(a, b) == 512


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace absent")
def test_mooncake_hash_ids_become_shared_prefixes():
    frame = load_requests(MOONCAKE).iloc[:400].reset_index(drop=True)
    synth = PromptSynthesizer(frame)
    blocks = frame["prefix_block_ids"].tolist()
    first = {}
    pairs = []
    for i, b in enumerate(blocks):
        if b and b[0] in first and len(pairs) < 5:
            pairs.append((first[b[0]], i))
        first.setdefault(b[0] if b else None, i)
    assert pairs, "the trace's first 400 requests share some prefix block"
    for i, j in pairs:
        shared = 0
        while shared < min(len(blocks[i]), len(blocks[j])) and blocks[i][shared] == blocks[j][shared]:
            shared += 1
        a, b = synth.token_ids(i), synth.token_ids(j)
        assert len(a) == frame["prompt_tokens"][i] and len(b) == frame["prompt_tokens"][j]
        expected = min(shared * 512, len(a), len(b))
        assert _common_prefix(a, b) >= expected
        if shared < min(len(blocks[i]), len(blocks[j])):  # a differing block: the prefix ends there (±chance)
            assert _common_prefix(a, b) < expected + 3
