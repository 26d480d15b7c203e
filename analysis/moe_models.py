"""Public MoE model configs, parallelism and GPU assumptions for the MixNet iteration-time model.

Model numbers are copied from each model's public Hugging Face `config.json` (cited per entry).
Parallelism, micro-batching, sequence length and GPU throughput are *assumptions* (see docs/mixnet.md).
Pure data plus FLOP counting; no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


class ModelConfigError(ValueError):
    """An inconsistent model / parallelism / GPU configuration."""


@dataclass(frozen=True)
class MoeModel:
    """Architecture of a decoder-only MoE transformer (public model-card numbers)."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    n_experts: int
    top_k: int
    expert_ffn: int            # routed expert intermediate size (SwiGLU: 3 matrices)
    n_shared_experts: int      # always-active experts computed locally (no all-to-all)
    shared_ffn: int            # intermediate size of *one* shared expert
    first_dense_layers: int    # leading layers with a dense FFN instead of MoE
    dense_ffn: int
    vocab: int
    source: str

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.first_dense_layers

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


# Every number below comes from the model's config.json on huggingface.co (fields in comments).
MODELS: dict[str, MoeModel] = {
    # huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json:
    # num_hidden_layers 32, hidden_size 4096, num_attention_heads 32, num_key_value_heads 8,
    # num_local_experts 8, num_experts_per_tok 2, intermediate_size 14336, vocab_size 32000
    "mixtral-8x7b": MoeModel("mixtral-8x7b", 32, 4096, 32, 8, 8, 2, 14336, 0, 0, 0, 0, 32000,
                             "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json"),
    # huggingface.co/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json:
    # num_hidden_layers 56, hidden_size 6144, num_attention_heads 48, num_key_value_heads 8,
    # num_local_experts 8, num_experts_per_tok 2, intermediate_size 16384, vocab_size 32000
    "mixtral-8x22b": MoeModel("mixtral-8x22b", 56, 6144, 48, 8, 8, 2, 16384, 0, 0, 0, 0, 32000,
                              "huggingface.co/mistralai/Mixtral-8x22B-v0.1 config.json"),
    # huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json:
    # num_hidden_layers 24, hidden_size 2048, num_attention_heads 16, num_key_value_heads 16,
    # num_experts 60, num_experts_per_tok 4, moe_intermediate_size 1408,
    # shared_expert_intermediate_size 5632 (one shared expert), vocab_size 151936
    "qwen1.5-moe-a2.7b": MoeModel("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 60, 4, 1408, 1, 5632, 0, 0,
                                  151936, "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json"),
    # huggingface.co/deepseek-ai/deepseek-moe-16b-base/blob/main/config.json:
    # num_hidden_layers 28, hidden_size 2048, num_attention_heads 16, num_key_value_heads 16,
    # n_routed_experts 64, num_experts_per_tok 6, moe_intermediate_size 1408, n_shared_experts 2,
    # first_k_dense_replace 1, intermediate_size 10944 (dense layer), vocab_size 102400
    "deepseek-moe-16b": MoeModel("deepseek-moe-16b", 28, 2048, 16, 16, 64, 6, 1408, 2, 1408, 1, 10944,
                                 102400, "huggingface.co/deepseek-ai/deepseek-moe-16b-base config.json"),
    # huggingface.co/llama-moe/LLaMA-MoE-v1-3_5B-2_8 (configuration_llama_moe.py defaults and the org card):
    # hidden_size 4096, num_hidden_layers 32, num_attention_heads 32 (KV heads = heads), vocab_size 32000,
    # 8 experts, 2 selected ("2/8"); LLaMA-2-7B's intermediate_size 11008 split evenly, 1376 per expert
    # (the 2/16 sibling's config lists size_experts 688 = 11008/16). One of the MixNet paper's four models.
    "llama-moe-3.5b": MoeModel("llama-moe-3.5b", 32, 4096, 32, 32, 8, 2, 1376, 0, 0, 0, 0, 32000,
                               "huggingface.co/llama-moe/LLaMA-MoE-v1-3_5B-2_8 config"),
}


@dataclass(frozen=True)
class Parallelism:
    """How one training job is laid out. A MixNet region is one EP group: ep*tp/gpus_per_server servers."""

    ep: int
    tp: int
    pp: int
    micro_batches: int
    micro_batch_sequences: int   # sequences per EP rank (TP group) per micro-batch
    seq_len: int
    dp: int = 1                  # data-parallel pipeline replicas (independent reconfiguration delays)
    gpus_per_server: int = 8

    @property
    def tokens_per_rank(self) -> int:
        return self.micro_batch_sequences * self.seq_len

    @property
    def region_servers(self) -> int:
        return self.ep * self.tp // self.gpus_per_server

    @property
    def servers(self) -> int:
        return self.region_servers * self.pp * self.dp


@dataclass(frozen=True)
class GpuSpec:
    """Sustained GPU throughput = peak dense BF16 FLOP/s × model FLOP utilisation (an assumption)."""

    name: str
    peak_flops: float
    mfu: float
    nvlink_bytes_per_s: float    # per GPU, one direction

    @property
    def flops(self) -> float:
        return self.peak_flops * self.mfu


# Peak dense BF16 from the vendor datasheets (H100 SXM 989 TFLOP/s, A100 SXM 312 TFLOP/s; NVLink 450 /
# 300 GB/s per direction). MFU 0.4 is an assumption typical of large MoE training reports.
GPUS: dict[str, GpuSpec] = {
    "h100-sxm": GpuSpec("h100-sxm", 989e12, 0.40, 450e9),
    "a100-sxm": GpuSpec("a100-sxm", 312e12, 0.40, 300e9),
}

# Assumed layouts: each region spans >= 4 servers so the regional OCS matters, EP divides the expert
# count, and PP divides the layers roughly evenly (Mixtral-8x7B's EP 8 x TP 4 x PP 4 and Mixtral-8x22B's
# EP 8 x TP 8 x PP 8 are the MixNet authors' own layouts). Micro-batch sizing (an assumption, see
# docs/mixnet.md): one 4096-token sequence per GPU per micro-batch. An EP rank is a TP group of tp GPUs,
# so it routes tp sequences; the expert compute per GPU is then that of a TP = 1 layout at micro-batch
# size 1, the low end of common MoE training practice.
SEQUENCES_PER_GPU = 1
SEQ_LEN = 4096


def _layout(ep: int, tp: int, pp: int, micro_batches: int = 8, dp: int = 1) -> Parallelism:
    return Parallelism(ep=ep, tp=tp, pp=pp, micro_batches=micro_batches,
                       micro_batch_sequences=SEQUENCES_PER_GPU * tp, seq_len=SEQ_LEN, dp=dp)


DEFAULT_PARALLELISM: dict[str, Parallelism] = {
    "mixtral-8x7b": _layout(ep=8, tp=4, pp=4),
    "mixtral-8x22b": _layout(ep=8, tp=8, pp=8, dp=2),   # the authors' run: dp 2, tp 8, pp 8, ep 8
    "qwen1.5-moe-a2.7b": _layout(ep=12, tp=4, pp=2),
    "deepseek-moe-16b": _layout(ep=16, tp=2, pp=4),
    "llama-moe-3.5b": _layout(ep=8, tp=4, pp=4),     # as Mixtral-8x7B: same width, depth and expert count
}

DTYPE_BYTES = 2  # BF16 activations on the wire


def get_model(name: str) -> MoeModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelConfigError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None


def validate(model: MoeModel, par: Parallelism) -> None:
    """Raise ModelConfigError when the layout cannot host the model."""
    if min(par.ep, par.tp, par.pp, par.micro_batches, par.micro_batch_sequences, par.seq_len, par.dp) < 1:
        raise ModelConfigError("parallelism degrees, micro-batches and lengths must be >= 1")
    if model.n_experts % par.ep:
        raise ModelConfigError(f"ep={par.ep} does not divide {model.n_experts} experts of {model.name}")
    if (par.ep * par.tp) % par.gpus_per_server or par.gpus_per_server % par.tp:
        raise ModelConfigError(f"ep*tp={par.ep * par.tp} must fill whole {par.gpus_per_server}-GPU servers "
                               f"and tp must divide a server")
    if par.pp > model.n_layers:
        raise ModelConfigError(f"pp={par.pp} exceeds {model.n_layers} layers")


def stage_layers(model: MoeModel, pp: int) -> list[tuple[int, int]]:
    """Per pipeline stage: (dense layers, MoE layers), layers split as evenly as possible in order."""
    bounds = np.linspace(0, model.n_layers, pp + 1).round().astype(int)
    stages = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        dense = max(0, min(hi, model.first_dense_layers) - lo)
        stages.append((dense, int(hi - lo - dense)))
    return stages


def attention_flops_per_token(model: MoeModel, seq_len: int) -> float:
    """Forward FLOPs per token of one attention block (projections + causal score/value matmuls + router)."""
    hd = model.head_dim
    projections = 2 * model.hidden * (2 * model.n_heads * hd + 2 * model.n_kv_heads * hd)
    scores = 2 * seq_len * model.n_heads * hd   # QK^T and AV, halved by causality
    router = 2 * model.hidden * model.n_experts
    return float(projections + scores + router)


def expert_flops_per_assignment(model: MoeModel) -> float:
    """Forward FLOPs for one (token, routed expert) pair: SwiGLU = 3 matmuls of hidden x ffn."""
    return float(2 * 3 * model.hidden * model.expert_ffn)


def local_ffn_flops_per_token(model: MoeModel, dense: bool) -> float:
    """Forward FLOPs per token of the FFN work done without all-to-all (shared experts or a dense FFN)."""
    if dense:
        return float(2 * 3 * model.hidden * model.dense_ffn)
    return float(2 * 3 * model.hidden * model.shared_ffn * model.n_shared_experts)


def head_flops_per_token(model: MoeModel) -> float:
    """Forward FLOPs per token of the LM head (last stage)."""
    return float(2 * model.hidden * model.vocab)


def parameter_counts(model: MoeModel) -> tuple[float, float]:
    """(total, active per token) parameters implied by the config (norms and biases ignored)."""
    h, hd = model.hidden, model.head_dim
    attention = h * (2 * model.n_heads * hd + 2 * model.n_kv_heads * hd)
    expert = 3 * h * model.expert_ffn
    shared = model.n_shared_experts * 3 * h * model.shared_ffn
    router = h * model.n_experts
    dense = model.first_dense_layers * 3 * h * model.dense_ffn
    embeddings = 2 * model.vocab * h     # untied input embedding and LM head
    base = model.n_layers * attention + dense + embeddings + model.n_moe_layers * (shared + router)
    return (float(base + model.n_moe_layers * model.n_experts * expert),
            float(base + model.n_moe_layers * model.top_k * expert))


def with_overrides(par: Parallelism, **changes) -> Parallelism:
    """A copy of `par` with some fields changed (e.g. micro_batches=16)."""
    return replace(par, **changes)


def forward_flops_per_token(model: MoeModel, seq_len: int) -> float:
    """Forward FLOPs per token of the whole model (attention incl. causal scores, dense/shared/routed FFN, head)."""
    return float(model.n_layers * attention_flops_per_token(model, seq_len)
                 + model.first_dense_layers * local_ffn_flops_per_token(model, dense=True)
                 + model.n_moe_layers * (local_ffn_flops_per_token(model, dense=False)
                                         + model.top_k * expert_flops_per_assignment(model))
                 + head_flops_per_token(model))


def iteration_flops(model: MoeModel, par: Parallelism) -> float:
    """Training FLOPs of one iteration of the whole job (forward + 2× backward = 3× forward), every replica."""
    tokens = par.tokens_per_rank * par.ep * par.micro_batches * par.dp
    return 3.0 * tokens * forward_flops_per_token(model, par.seq_len)


def gpus(par: Parallelism) -> int:
    return par.servers * par.gpus_per_server

