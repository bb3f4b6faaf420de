"""Plan a training run by simulating its step: ``simpmd.plan``.

    from simpmd import plan
    model = plan.Transformer(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                             vocab=128256, seq=4096, gated_mlp=True)
    layout = plan.Layout(tp=4, pp=4, vp=20, dp=4, global_batch=128)
    result = plan.estimate(model, layout, hardware="H100", precision="fp8")

The step is built as one SPMD program on shapes (:mod:`~simpmd.plan.step`: the layers a
``scan`` with ``checkpoint``, the pipeline's ticks a ``scan``, Megatron's tensor
parallelism, FSDP, context parallelism, the optimizer) and costed by walking that program.
"""
from .model import LLAMA3_8B, LLAMA3_70B, MIXTRAL_8X7B, Transformer
from .layout import Layout, LayoutError, check
from .simulate import Estimate, estimate, sweep
from .serve import ServingEstimate, serve
