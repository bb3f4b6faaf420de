"""Node-limited routing and FP8 dispatch (DeepSeek-V3 report, arXiv:2412.19437, sections
2.1.2, 3.2.2 and 3.3): the step on values against the one-device step, the restricted
router against NumPy, and the bytes each rank sends across nodes worked out by hand."""
import importlib.util
import math
import os
import sys
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import simpmd
from simpmd import plan
from simpmd.plan import layers as L, step as St

sys.path.insert(0, os.path.dirname(__file__))
from test_plan import _run as plan_run  # noqa: E402

needs_bf16 = pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None,
                                reason="the planner's steps are in bfloat16 (ml_dtypes)")
SMALL = plan.Transformer(layers=2, d_model=16, heads=2, kv_heads=2, d_ff=24, vocab=32, seq=8,
                         gated_mlp=True, experts=4, top_k=2, expert_d_ff=8, shared_experts=1)


def _weights(model, layout, seed=0):
    rng = np.random.default_rng(seed)
    return {k: np.ones(s, np.float32) if k.endswith("norm") else
            (rng.normal(size=s) / math.sqrt(s[-2])).astype(np.float32)
            for k, s in St.param_shapes(model, layout).items()}


def _run(model, layout, weights, node_gpus=None):
    return plan_run(layout, weights, model, node_gpus=node_gpus)


@pytest.mark.parametrize("node_gpus", [2, 1])       # 2 nodes of 2 ranks; 4 nodes of 1
def test_the_node_limited_dispatch_computes_the_one_device_step(node_gpus):
    """With as many nodes allowed as a token's experts can span (route_nodes = top_k), the
    routing is the free one, so the loss and every Adam moment equal the one-device step's:
    the rotations across and within nodes deliver and return every token."""
    one = plan.Layout(global_batch=8, microbatch=2, expert_load=2.0)
    lay = plan.Layout(ep=4, global_batch=8, microbatch=2, expert_load=2.0)
    w = _weights(SMALL, one)
    _, ref_opt, ref_loss = _run(SMALL, one, w)
    _, opt, loss = _run(replace(SMALL, route_nodes=2), lay, w, node_gpus=node_gpus)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    for k in w:
        np.testing.assert_allclose(np.asarray(opt["mu"][k]), np.asarray(ref_opt["mu"][k]),
                                   rtol=2e-4, atol=1e-7, err_msg=k)


def test_the_router_keeps_each_token_on_its_best_nodes():
    """Section 2.1.2: the M nodes with the largest sums of their top_k / M best affinities,
    then the top_k experts among those nodes' (NumPy by hand: 8 experts on 4 nodes)."""
    m = replace(SMALL, experts=8, top_k=4, route_nodes=2)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    router = rng.normal(size=(16, 8)).astype(np.float32)
    s = L.Shard(m, {"ep": 8}, node_ranks=2)
    _, chosen, _, _ = L.route(s, x, router)
    logits = x @ router
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for i in range(32):
        per = p[i].reshape(4, 2)
        score = np.sort(per, axis=1)[:, -2:].sum(1)
        nodes = np.argsort(-score, kind="stable")[:2]
        allowed = np.where(np.isin(np.arange(8) // 2, nodes), p[i], -1)
        want = np.argsort(-allowed, kind="stable")[:4]
        assert sorted(np.asarray(chosen)[i].tolist()) == sorted(want.tolist())
        assert len(set(np.asarray(chosen)[i] // 2)) <= 2


@needs_bf16
def test_bytes_across_nodes_by_hand():
    """ep = 32 H800s in 4 nodes of 8, 512 tokens a rank, 32 experts, top 4, M = 2 nodes,
    D = 256: each token crosses IB once to each of its nodes, so a rank sends each other
    node U = 512 x 2 / 4 = 256 tokens, 256 x 256 x 2 = 131,072 bytes (bf16), or 65,536 in
    FP8 with 256 x 2 float32 scales (2,048 bytes); within the node each of 7 peers gets
    its expert's C = 512 x 4 / 32 = 64 slots from each of the 4 nodes' tokens, 1 x 4 x 64 x
    256 x 2 = 131,072 bytes. Forward: 3 across + 7 within (dispatch), 7 + 3 (combine);
    the backward pass as many again. Without node-limited routing, the all_to_all moves
    each rank's 512 x 4 copies, 512 x 4 x 256 x 2 = 1,048,576 bytes."""
    m = plan.Transformer(layers=2, d_model=256, heads=2, kv_heads=2, d_ff=512, vocab=64,
                         seq=512, gated_mlp=True, experts=32, top_k=4, expert_d_ff=128,
                         route_nodes=2)
    lay = plan.Layout(ep=32, microbatch=1, global_batch=32)
    est = lambda model, layout: plan.estimate(model, layout, hardware="H800", precision="fp8",
                                              framework="megatron", check_memory=False,
                                              memory=False)
    sent = lambda e: Counter(c[2] for c in e.collectives if c[0] == "ppermute")
    bf16 = sent(est(m, lay))
    assert bf16[131072] == 2 * (3 + 7 + 7 + 3)
    fp8 = sent(est(m, replace(lay, fp8_dispatch=True)))
    assert fp8[65536] == 3 + 7                         # the forward dispatch, in FP8
    assert fp8[131072] == 2 * (3 + 7 + 7 + 3) - (3 + 7)
    assert fp8[2048] == bf16[2048] + 3 + 7             # the scales, forward only
    free = est(replace(m, route_nodes=None), lay)
    assert {c[2] for c in free.collectives if c[0] == "all_to_all"} == {512 * 4 * 256 * 2}
    plain8 = est(replace(m, route_nodes=None), replace(lay, fp8_dispatch=True))
    a2a = Counter(c[2] for c in plain8.collectives if c[0] == "all_to_all")
    assert a2a[512 * 4 * 256] >= 1 and a2a[512 * 4 * 2 * 4] >= 1   # FP8 tokens, scales


def test_options_are_checked():
    with pytest.raises(ValueError, match="route_nodes"):
        replace(SMALL, route_nodes=3)
    with pytest.raises(plan.LayoutError, match="fp8_dispatch"):
        plan.estimate(SMALL, plan.Layout(ep=2, global_batch=2, fp8_dispatch=True),
                      hardware="H800", check_memory=False)


def test_node_ranks_that_do_not_tile_ep_are_refused():
    """ep = 12 ranks on nodes of 8 GPUs: a node holds 8 of them, 12 = 8 + 4 leaves a node
    half used, and node-limited routing's rotations over whole nodes would name ranks that
    do not exist. With cp x tp = 3 the ranks lie 3 apart and a node of 8 holds 2 or 3 of
    them. Both are refused by name; ep = 16 or 4 (whole nodes, or inside one) is not."""
    m = replace(SMALL, experts=24, route_nodes=2, seq=24)
    assert St.node_ranks(m, plan.Layout(ep=16, global_batch=16), 8) == 8
    assert St.node_ranks(m, plan.Layout(ep=4, global_batch=4), 8) == 4
    assert St.node_ranks(replace(m, route_nodes=None), plan.Layout(ep=12, global_batch=12),
                         8) is None
    with pytest.raises(plan.LayoutError, match=r"ep = 12.*node of 8 GPUs holds 8"):
        St.node_ranks(m, plan.Layout(ep=12, global_batch=12), 8)
    with pytest.raises(plan.LayoutError, match=r"holds 8 / 3, not a whole number.*cp x tp = 3"):
        St.node_ranks(m, plan.Layout(ep=4, cp=3, global_batch=4), 8)
    with pytest.raises(plan.LayoutError, match="ep = 12"):
        plan.estimate(m, plan.Layout(ep=12, microbatch=1, global_batch=12), hardware="H800",
                      check_memory=False, memory=False)
