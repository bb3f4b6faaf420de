"""Mixture-of-experts sizes in the planner (issue 48): parameters and model FLOPs against
closed forms written out here and against the published totals, and the committed
development / held-out draw of the MoE validation runs."""
import pytest

from simpmd import plan
from simpmd.plan.runs import moe


def _closed_form(L, D, H, KV, hd, V, E, k, F, shared=0, dense=0, dense_ff=0, active=False):
    """Parameters by hand: attention (fused q, k, v and the output), two norms a layer,
    gated experts (3 matrices each) and a router per MoE layer, embeddings and head."""
    attention = D * (H + 2 * KV) * hd + H * hd * D + 2 * D
    expert = 3 * D * F
    routed = k if active else E
    moe_mlp = D * E + (routed + shared) * expert
    return ((L - dense) * (attention + moe_mlp) + dense * (attention + 3 * D * dense_ff)
            + 2 * V * D + D)


def test_mixtral_params_match_the_published_total():
    m = plan.MIXTRAL_8X7B
    assert m.params == _closed_form(32, 4096, 32, 8, 128, 32000, 8, 2, 14336)
    assert m.params / 1e9 == pytest.approx(46.7, abs=0.05)      # Jiang et al. 2024: 46.7B
    assert m.active_params / 1e9 == pytest.approx(12.9, abs=0.05)  # and 12.9B active


@pytest.mark.parametrize("model, total, active", [
    (moe.QWEN3_30B_A3B, 30.5, 3.3),       # Qwen3 model cards: 30.5B, 3.3B activated
    (moe.QWEN3_235B_A22B, 235.0, 22.0),   # 235B, 22B activated (rounded)
])
def test_qwen3_params_match_the_model_cards(model, total, active):
    assert model.params / 1e9 == pytest.approx(total, abs=0.15)
    assert model.active_params / 1e9 == pytest.approx(active, abs=0.25)


def test_flops_per_token_count_active_parameters_only():
    m = plan.MIXTRAL_8X7B
    by_hand = 6 * _closed_form(32, 4096, 32, 8, 128, 32000, 8, 2, 14336, active=True) \
        + 12 * 32 * 32 * 128 * 4096
    assert m.flops_per_token() == by_hand
    assert m.flops_per_token() < 6 * m.params / 3


def test_shared_experts_and_dense_layers_by_hand():
    m = plan.Transformer(layers=6, d_model=64, heads=4, kv_heads=2, d_ff=512, vocab=100,
                         seq=16, gated_mlp=True, experts=16, top_k=2, expert_d_ff=32,
                         shared_experts=1, dense_layers=2)
    assert m.params == _closed_form(6, 64, 4, 2, 16, 100, 16, 2, 32, 1, 2, 512)
    assert m.active_params == _closed_form(6, 64, 4, 2, 16, 100, 16, 2, 32, 1, 2, 512,
                                           active=True)


def test_a_dense_model_is_unchanged():
    m = plan.LLAMA3_8B
    assert m.active_params == m.params and not m.moe


@pytest.mark.parametrize("bad, says", [
    (dict(experts=8, top_k=9), "top_k = 9"),
    (dict(shared_experts=1), "pass experts="),
    (dict(experts=8, capacity_factor=0), "capacity_factor"),
])
def test_bad_expert_settings_are_refused(bad, says):
    with pytest.raises(ValueError, match=says):
        plan.Transformer(layers=2, d_model=8, heads=2, d_ff=16, vocab=10, seq=4, **bad)


def test_the_moe_draw_is_the_committed_one():
    development, held_out = moe.redraw()
    assert (development, held_out) == (moe.DEVELOPMENT, moe.HELD_OUT)
    names = {moe.name(r) for r in moe.ROWS}
    assert set(development) | set(held_out) == names and not set(development) & set(held_out)
    assert {r[0] for r in moe.ROWS} >= {"H100", "B200"}       # two hardware generations


def test_measured_step_times_from_the_table():
    row = next(r for r in moe.ROWS if r[0] == "H100" and r[1] is moe.QWEN3_30B_A3B)
    assert moe.step_s(row) == pytest.approx(512 * 4096 / (5275 * 16))


def test_estimate_refuses_a_mixture_of_experts_it_cannot_step_yet():
    with pytest.raises(plan.LayoutError, match="mixture of experts"):
        plan.estimate(plan.MIXTRAL_8X7B, plan.Layout(dp=8))
