"""Seeded trace generators with ground truth: MoE traffic with Zipf expert popularity, drift and regime
changes at known iterations; Poisson and bursty (MMPP) inference arrivals with known burst windows;
DiLoCo sync windows."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from traces.moe import counts_to_routing, traffic_from_routing
from traces.schema import MoeHeader, MoeTrace


def generate_moe(*, seed: int, iterations: int = 50, layers: int = 4, micro_batches: int = 2,
                 num_experts: int = 16, top_k: int = 2, ep: int = 8, regions: int = 1,
                 tokens_per_micro_batch: int = 4096, hidden_size: int = 4096, dtype_bytes: int = 2,
                 zipf_s: float = 1.2, drift: float = 0.02, regime_changes: list[int] | int = 2,
                 ranks_per_server: int = 8, backward: bool = True) -> MoeTrace:
    """MoE all-to-all traffic. Expert e of layer l has popularity ∝ exp(logit), logit = −s·log(rank of e
    under a per-layer permutation) plus a Gaussian random walk of step `drift` per iteration. At each
    regime-change iteration every layer draws a fresh permutation (a large, sudden shift). Each rank's
    routed token copies (tokens·top_k per micro-batch) are multinomial over experts. Traffic stays inside
    each of `regions` EP groups of `ep` ranks (a MixNet region); experts are placed contiguously."""
    rng = np.random.default_rng(seed)
    if isinstance(regime_changes, int):
        k = regime_changes
        # Spread changes so each regime lasts at least a few iterations (detectors need a baseline).
        spacing = 3
        room = iterations - 2 * spacing - (k - 1) * (spacing - 1)
        if k and room < k:
            raise ValueError(f"{k} regime changes do not fit in {iterations} iterations")
        picks = np.sort(rng.choice(room, size=k, replace=False)) if k else np.empty(0, dtype=int)
        changes = (picks + spacing + np.arange(k) * (spacing - 1)).astype(int).tolist()
    else:
        changes = sorted(int(c) for c in regime_changes)
    if any(not 0 < c < iterations for c in changes):
        raise ValueError(f"regime changes must lie in (0, {iterations})")
    header = MoeHeader(num_experts=num_experts, top_k=top_k, hidden_size=hidden_size, dtype_bytes=dtype_bytes,
                       ep=ep, n_ranks=ep * regions, ranks_per_server=ranks_per_server)
    base = -zipf_s * np.log(np.arange(1, num_experts + 1))
    logits = np.stack([base[rng.permutation(num_experts)] for _ in range(layers)])
    n_ranks = ep * regions
    copies = tokens_per_micro_batch * top_k
    counts_all, keys = [], []
    grid = np.stack(np.meshgrid(np.arange(layers), np.arange(micro_batches), np.arange(n_ranks), indexing="ij"),
                    axis=-1).reshape(-1, 3)
    for it in range(iterations):
        if it in changes:
            logits = np.stack([base[rng.permutation(num_experts)] for _ in range(layers)])
        elif it:
            logits = logits + rng.normal(0.0, drift, size=logits.shape)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        counts_all.append(rng.multinomial(copies, probs[grid[:, 0]]))
        keys.append(np.column_stack([np.full(len(grid), it), grid]))
    counts = np.concatenate(counts_all)
    key = np.concatenate(keys).astype(np.int64)
    routing = counts_to_routing(counts, key[:, 0], key[:, 1], key[:, 2], key[:, 3])
    return MoeTrace(header, traffic_from_routing(routing, header, backward=backward), tuple(changes))


def _lengths(rng: np.random.Generator, n: int, median: float, sigma: float, cap: int) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, size=n)), 1, cap).astype(np.int64)


def _request_frame(rng: np.random.Generator, arrivals: np.ndarray, prompt_median: float, output_median: float
                   ) -> pd.DataFrame:
    # Defaults follow the Azure 2023 conversation trace's medians (prompt 1,020, output 129 tokens).
    return pd.DataFrame({"arrival_s": arrivals,
                         "prompt_tokens": _lengths(rng, len(arrivals), prompt_median, 1.0, 32768),
                         "output_tokens": _lengths(rng, len(arrivals), output_median, 1.0, 4096)})


def poisson_arrivals(*, seed: int, rate: float, duration_s: float, prompt_median: float = 1020,
                     output_median: float = 129) -> pd.DataFrame:
    """Homogeneous Poisson arrivals at `rate` per second on [0, duration_s), lognormal token counts."""
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate * duration_s)
    arrivals = np.sort(rng.uniform(0.0, duration_s, size=n))
    return _request_frame(rng, arrivals, prompt_median, output_median)


@dataclass(frozen=True)
class BurstyArrivals:
    requests: pd.DataFrame
    bursts: pd.DataFrame  # start_s, end_s: ground-truth burst windows


def mmpp_arrivals(*, seed: int, base_rate: float, burst_rate: float, duration_s: float, mean_burst_s: float = 5.0,
                  mean_gap_s: float = 30.0, prompt_median: float = 1020, output_median: float = 129
                  ) -> BurstyArrivals:
    """Two-state Markov-modulated Poisson process: exponential sojourns (mean `mean_gap_s` calm at
    `base_rate`, mean `mean_burst_s` bursting at `burst_rate`), starting calm. Returns the arrivals and
    the burst windows (ground truth)."""
    rng = np.random.default_rng(seed)
    t, bursting, segments = 0.0, False, []
    while t < duration_s:
        length = rng.exponential(mean_burst_s if bursting else mean_gap_s)
        end = min(duration_s, t + length)
        segments.append((t, end, bursting))
        t, bursting = end, not bursting
    arrivals = []
    for start, end, burst in segments:
        n = rng.poisson((burst_rate if burst else base_rate) * (end - start))
        arrivals.append(rng.uniform(start, end, size=n))
    times = np.sort(np.concatenate(arrivals)) if arrivals else np.empty(0)
    bursts = pd.DataFrame([(s, e) for s, e, b in segments if b], columns=["start_s", "end_s"])
    return BurstyArrivals(_request_frame(rng, times, prompt_median, output_median), bursts)


def diloco_sync_windows(*, seed: int, count: int, duration_s: float, window_s: float = 8.0,
                        min_gap_s: float = 18.0, bytes_per_sync: int = 2 * 10**9) -> pd.DataFrame:
    """`count` sync windows of `window_s` seconds, uniformly placed on [0, duration_s] with starts at
    least `min_gap_s` apart (and no overlap): the matched-random draw of `analysis.diloco.random_starts`."""
    from analysis.diloco import random_starts

    if count < 0:
        raise ValueError(f"{count} windows: the count must be >= 0")
    starts = random_starts(np.random.default_rng(seed), count, duration_s, window_s, min_gap_s)
    return pd.DataFrame({"start_s": starts, "duration_s": np.full(count, float(window_s)),
                         "bytes": np.full(count, int(bytes_per_sync), dtype=np.int64)})
