"""Model configs against their model cards' parameter counts; layouts and FLOP counts."""
from __future__ import annotations

import pytest

from analysis import moe_models as mm

# (total, active) parameters in billions as stated on each model card (huggingface.co pages / papers)
CARD_PARAMETERS = {
    "mixtral-8x7b": (46.7, 12.9),        # Mistral AI, "Mixtral of experts" (arXiv 2401.04088)
    "mixtral-8x22b": (141.0, 39.0),      # mistral.ai/news/mixtral-8x22b
    "qwen1.5-moe-a2.7b": (14.3, 2.7),    # Qwen/Qwen1.5-MoE-A2.7B model card
    "deepseek-moe-16b": (16.4, 2.8),     # deepseek-ai/deepseek-moe-16b-base card (arXiv 2401.06066)
    "llama-moe-3.5b": (6.7, 3.5),        # llama-moe org card: 3.5B activated; LLaMA-2-7B split (arXiv 2406.16554)
}


@pytest.mark.parametrize("name", sorted(mm.MODELS))
def test_config_reproduces_model_card_parameter_counts(name):
    total, active = mm.parameter_counts(mm.MODELS[name])
    card_total, card_active = CARD_PARAMETERS[name]
    assert total / 1e9 == pytest.approx(card_total, rel=0.02)
    assert active / 1e9 == pytest.approx(card_active, rel=0.03)


@pytest.mark.parametrize("name", sorted(mm.MODELS))
def test_default_layouts_are_valid_and_cover_all_layers(name):
    model, par = mm.MODELS[name], mm.DEFAULT_PARALLELISM[name]
    mm.validate(model, par)
    stages = mm.stage_layers(model, par.pp)
    assert len(stages) == par.pp
    assert sum(d for d, _ in stages) == model.first_dense_layers
    assert sum(m for _, m in stages) == model.n_moe_layers
    assert max(d + m for d, m in stages) - min(d + m for d, m in stages) <= 1
    assert par.region_servers >= 2        # otherwise the regional OCS carries nothing


def test_flops_are_twice_the_parameters_touched():
    m = mm.MODELS["mixtral-8x7b"]
    assert mm.expert_flops_per_assignment(m) == 2 * 3 * 4096 * 14336
    projections = 4096 * (2 * 32 * 128 + 2 * 8 * 128)
    assert mm.attention_flops_per_token(m, 0) == 2 * projections + 2 * 4096 * 8
    assert mm.local_ffn_flops_per_token(mm.MODELS["deepseek-moe-16b"], dense=True) == 2 * 3 * 2048 * 10944


def test_invalid_layouts_are_rejected():
    q = mm.MODELS["qwen1.5-moe-a2.7b"]
    with pytest.raises(mm.ModelConfigError, match="does not divide"):
        mm.validate(q, mm.Parallelism(ep=8, tp=2, pp=1, micro_batches=1, micro_batch_sequences=1, seq_len=8))
    with pytest.raises(mm.ModelConfigError, match="whole"):
        mm.validate(q, mm.Parallelism(ep=6, tp=1, pp=1, micro_batches=1, micro_batch_sequences=1, seq_len=8))
    with pytest.raises(mm.ModelConfigError):
        mm.get_model("gpt-5")
