"""gradkit in PyTorch: ``torch.ops.gradkit.*`` (loaded on import), autograd functions whose
backward runs on gradkit's operators, and an MoE FFN layer built from them.

    import gradkit.torch as gkt
    layer = gkt.MoeFFN(hidden=256, ffn_hidden=512, num_experts=8, topk=2)

CPU tensors; float32, float16 and bfloat16 (the operators' dtypes). Errors from gradkit are raised
as RuntimeError with its message (the argument, its value and the rule).
"""
import os
import warnings

from gradkit.torch._library import library_path, load

ops = load()

from gradkit.torch.functional import (  # noqa: E402  (the ops must be registered first)
    GROUP_LIST_COUNT, GROUP_LIST_CUMSUM, ROW_IDX_GATHER, ROW_IDX_SCATTER, MoeRouting, elu,
    moe_combine, moe_expert_linear, moe_grouped_linear, moe_route)
from gradkit.torch.moe import MoeFFN, TorchMoeFFN, top_k_gating  # noqa: E402
from gradkit.torch.aten import aten_elu_backward_calls, aten_elu_backward_on_gradkit  # noqa: E402


def version():
    """gradkit's version, as the loaded extension reports it."""
    return ops.version()


def use_huge_pages(enable=True):
    """Turns torch's CPU allocator into one that advises every block of 4 MiB or more for
    transparent huge pages (what PyTorch 2.1+ does under THP_MEM_ALLOC_ENABLE=1), or back; returns
    whether it was on. For the whole process: the activations and autograd buffers torch allocates
    itself are then faulted in 2 MiB at a time (docs/torch.md, "Memory allocator"). Also turned
    on at import when THP_MEM_ALLOC_ENABLE=1. It swaps a process-wide pointer that torch reads on
    every allocation: switch while no other thread runs torch ops (at start-up, as torch does)."""
    return ops.use_huge_pages(bool(enable))


if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1":
    try:
        use_huge_pages(True)
    except RuntimeError as error:  # another library holds torch's allocator: import all the same
        warnings.warn(f"gradkit.torch: THP_MEM_ALLOC_ENABLE=1 not applied: {error}", RuntimeWarning)


__all__ = [
    "GROUP_LIST_COUNT", "GROUP_LIST_CUMSUM", "ROW_IDX_GATHER", "ROW_IDX_SCATTER", "MoeFFN",
    "aten_elu_backward_calls", "aten_elu_backward_on_gradkit",
    "MoeRouting", "TorchMoeFFN", "elu", "library_path", "moe_combine", "moe_expert_linear",
    "moe_grouped_linear", "moe_route", "ops", "top_k_gating", "use_huge_pages", "version",
]
