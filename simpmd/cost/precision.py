"""Which matrix-unit path a dot runs on, as XLA runs it: its operand types, ``precision``
and ``preferred_element_type`` decide.

A jaxpr's ``dot_general`` carries ``precision`` (None, a pair of ``lax.Precision``, or a
``lax.DotAlgorithmPreset``) and ``preferred_element_type``; ``jax.default_matmul_precision``
is written into the equation when it is traced (checked on jax 0.7.2, 0.10.2, 0.12.0.1:
"highest" gives ``(HIGHEST, HIGHEST)``, "tensorfloat32" gives ``(HIGH, HIGH)``). What
XLA does with it (``jax.lax.Precision``'s docstring):

* float32 operands at DEFAULT: one bfloat16 pass on a TPU; TF32 tensor cores on a GPU that
  has them (A100, H100, H200, L4), else the FP32 units (T4); HIGH: 3 bf16 passes on a TPU,
  TF32 on a GPU; HIGHEST: 6 bf16 passes on a TPU, the FP32 units on a GPU;
* 16-bit floats: the bf16/fp16 rate of the matrix units (a T4 has no bfloat16 tensor cores:
  XLA computes bf16 dots there in float32, and the T4 preset's bf16 rate is its FP32 one);
* float8: the fp8 rate where the chip has it (H100, H200, L4, B200), else as bf16;
* an algorithm preset names its path (``"BF16_BF16_F32_X6"``: six bf16 passes).

A path is a name the presets price (:meth:`Hardware.matmul_peak`): ``"bf16"``, ``"fp16"``,
``"tf32"``, ``"fp32"``, ``"fp8"``, ``"int8"``, with ``"xN"`` for N passes.
"""
from __future__ import annotations

import numpy as np

LEVELS = {"DEFAULT": 0, "FASTEST": 0, "HIGH": 1, "HIGHEST": 2}
PRESETS = {"ANY_F8": "fp8", "F16_F16": "fp16", "BF16_BF16": "bf16", "TF32_TF32": "tf32",
           "F32_F32": "fp32", "F64_F64": "fp64"}


def _name(dtype) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def _level(precision) -> tuple:
    """(level, preset path or None) from a dot's ``precision`` parameter."""
    if precision is None:
        return 0, None
    if isinstance(precision, (tuple, list)):
        return max((_level(p)[0] for p in precision), default=0), None
    name = getattr(precision, "name", None) or str(precision).split(".")[-1]
    name = name.upper()
    if name in LEVELS:
        return LEVELS[name], None
    for prefix, path in PRESETS.items():
        if name.startswith(prefix):
            passes = name.rsplit("_X", 1)[1] if "_X" in name else ""
            return 0, path + (f"x{passes}" if passes.isdigit() else "")
    raise ValueError(f"dot_general precision {precision!r} is not one simpmd knows: give "
                     f"a lax.Precision (DEFAULT, HIGH, HIGHEST) or a lax.DotAlgorithmPreset")


def dot_path(hw, lhs_dtype, rhs_dtype, precision=None, preferred_element_type=None) -> str:
    """The path of ``hw``'s matrix units a dot of these operands runs on (see the module)."""
    level, preset = _level(precision)
    if preset is not None:
        return preset
    names = {_name(lhs_dtype), _name(rhs_dtype)}
    if all(n.startswith("float8") for n in names):
        return "fp8" if hw.has_path("fp8") else _sixteen_bit(hw, "bfloat16")
    sixteen = {"bfloat16", "float16"}
    if names & sixteen and all(n in sixteen or n.startswith("float8") for n in names):
        return _sixteen_bit(hw, "float16" if names == {"float16"} else "bfloat16")
    if names <= {"int8", "uint8"}:
        return "int8" if hw.has_path("int8") else _sixteen_bit(hw, "bfloat16")
    if "float64" in names:
        return "fp64"
    return _float32(hw, level)


def _sixteen_bit(hw, name: str) -> str:
    return "fp16" if name == "float16" else "bf16"


def _float32(hw, level: int) -> str:
    if hw.platform == "tpu":
        return ("bf16", "bf16x3", "bf16x6")[level]
    if hw.platform == "gpu" and level < 2 and hw.has_path("tf32"):
        return "tf32"
    return "fp32"


def eqn_path(hw, eqn, in_avals) -> str:
    """:func:`dot_path` of a ``dot_general`` (or convolution) equation."""
    lhs, rhs = in_avals[0], in_avals[1]
    params = eqn.params
    return dot_path(hw, lhs.dtype, rhs.dtype, params.get("precision"),
                    params.get("preferred_element_type"))
