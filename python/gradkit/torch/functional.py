"""Autograd functions on gradkit's operators.

Every backward here is a gradkit operator: ELU's by ``elu_grad_v2``, an expert matmul's input
gradient by the fused ``moe_init_routing_grouped_matmul_grad`` (or the transposed grouped matmul),
its weight gradient by ``grouped_matmul_weight_grad``, and the combine's by
``moe_finalize_routing_grad``. Expert matmuls read the token matrix through the routing
(gather-fused): the expanded copy of x is never made, in the forward or the backward.
"""
from typing import NamedTuple

import torch

from gradkit.torch._library import load

ROW_IDX_GATHER = 0   # expanded_row_idx[i] = slot of expanded row i (slot p = b * topk + j)
ROW_IDX_SCATTER = 1  # expanded_row_idx[p] = expanded row of slot p, or -1 when dropped
GROUP_LIST_COUNT = 0
GROUP_LIST_CUMSUM = 1


def _ops():
    return load()


class MoeRouting(NamedTuple):
    """Where each token's expert choices went: expanded rows grouped by expert, in slot order.

    expanded_row_idx: int64 [M], the slot (b * topk + j) of each expanded row (gather form).
    group_list: int64 [num_experts], rows per expert (counts; they sum to M).
    """
    expanded_row_idx: torch.Tensor
    group_list: torch.Tensor
    batch: int
    topk: int

    @property
    def rows(self):
        return self.expanded_row_idx.shape[0]

    def token_of_row(self):
        """The token b of each expanded row, int64 [M]."""
        return torch.div(self.expanded_row_idx, self.topk, rounding_mode="floor")


def moe_route(x, expert_idx, num_experts, capacity=0):
    """The routing of ``x`` [batch, H] by ``expert_idx`` [batch, topk], without expanding x.

    capacity > 0 keeps each expert's first ``capacity`` slots (in slot order) and drops the rest.
    """
    idx, groups = _ops().moe_init_routing_index(x, expert_idx, capacity, num_experts,
                                                GROUP_LIST_COUNT, ROW_IDX_GATHER)
    return MoeRouting(idx, groups, x.shape[0], expert_idx.shape[1])


def _check_float(name, t):
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"gradkit: {name} has dtype {t.dtype}; gradkit's operators take "
                        "float32, float16 and bfloat16")


class _Elu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, scale, input_scale, save_result):
        y = torch.ops.aten.elu(x, alpha, scale, input_scale)
        ctx.save_for_backward(y if save_result else x)
        ctx.coefficients = (alpha, scale, input_scale, save_result)
        return y

    @staticmethod
    def backward(ctx, dy):
        (saved,) = ctx.saved_tensors
        alpha, scale, input_scale, is_result = ctx.coefficients
        dx = _ops().elu_grad_v2(dy, saved, alpha, scale, input_scale, is_result)
        return dx, None, None, None, None


def elu(x, alpha=1.0, scale=1.0, input_scale=1.0, save_result=False):
    """ELU (SELU, CELU with the matching coefficients): forward by torch, backward by gradkit.

    save_result keeps the output instead of the input for the backward (is_result); it needs
    alpha >= 0, as the output must determine the input's sign.
    """
    _check_float("x", x)
    if save_result and alpha < 0:
        raise ValueError(f"gradkit.torch.elu: save_result needs alpha >= 0, alpha is {alpha}")
    return _Elu.apply(x, float(alpha), float(scale), float(input_scale), bool(save_result))


# MoeFFN's second expert matmul, forward and backward, runs in chunks of whole experts, in
# expert order, each with about this many bytes of [rows, max(F, H)] temporaries (at least one
# expert): act(h) [rows, F] and the backward's d_y rows [rows, H] exist for one chunk at a time,
# not for all M rows. The split depends on the routing, F and H only. 4 MiB: at S1 (bfloat16)
# the step's peak is in that node's backward, whose chunk temporaries 16 MiB chunks made 6 MiB
# larger, and the step time did not change between 4, 8 and 16 MiB; a small layer (the demo's:
# H 256, F 512, 2048 tokens, one 8 MiB chunk) faulted its fresh act(h) in page by page on every
# step, median steps 69-96 ms at 8 MiB against 43-61 at 4 (64 experts of ~256 rows: the same;
# 2 MiB: 10% slower there) (docs/benchmarks.md, session 32).
CHUNK_BYTES = 4 << 20


def expert_chunks(counts, row_bytes, chunk_bytes=None):
    """[(first expert, end expert, first row, end row)]: consecutive experts, their rows."""
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    chunks, g0, r0, rows = [], 0, 0, 0
    for g, c in enumerate(counts):
        if rows > 0 and (rows + c) * row_bytes > chunk_bytes:
            chunks.append((g0, g, r0, r0 + rows))
            g0, r0, rows = g, r0 + rows, 0
        rows += c
    chunks.append((g0, len(counts), r0, r0 + rows))
    return chunks


class _WeightGradSink:
    """Where an expert matmul's backward puts its weight gradient, chunk of experts by chunk.

    Default: a new tensor, returned to autograd (which adds it into ``weight.grad``).
    Gradient-accumulation fusion (``fuse``, for a leaf weight): ``weight.grad`` itself, added
    into by ``grouped_matmul_weight_grad_add_`` (or made and written when it does not exist
    yet); the backward then returns None for the weight, so no temporary of the weight's size
    exists. Falls back to the default when ``weight.grad`` cannot take it in place (another
    dtype, not contiguous, or part of a graph itself).
    """

    def __init__(self, weight, fuse):
        self.param, self.add = None, False
        if fuse and weight.is_leaf and weight.requires_grad:
            grad = weight.grad
            if grad is None:
                self.param = weight
            elif (grad.dtype == weight.dtype and grad.is_contiguous()
                  and grad.device == weight.device and not grad.requires_grad):
                self.param, self.add = weight, True
        self.target = (weight.grad if self.add
                       else torch.empty_like(weight, memory_format=torch.contiguous_format))

    def write(self, g0, g1, x, dy, counts, *routing):
        """The gradient of experts [g0, g1) from their rows x, dy (counts per expert)."""
        if self.add:
            _ops().grouped_matmul_weight_grad_add_(self.target[g0:g1], x, dy, counts,
                                                   GROUP_LIST_COUNT, *routing)
        else:
            _ops().grouped_matmul_weight_grad.out(x, dy, counts, GROUP_LIST_COUNT, *routing,
                                                  out=self.target[g0:g1])

    def result(self):
        """What the backward returns for the weight: None once it is in weight.grad."""
        if self.param is None:
            return self.target
        if not self.add:
            self.param.grad = self.target
        return None


class _GroupedLinearGather(torch.autograd.Function):
    """y[i] = x[token(i)] @ weight[g(i)], x read through the routing. Backward: d_x by the fused
    operator and d_weight by the weight-gradient one, each one call over every expert (neither
    makes a temporary of [rows, F]: d_y is read in place, x through the routing)."""

    @staticmethod
    def forward(ctx, x, weight, expanded_row_idx, group_list, topk, fuse_grad=False):
        y = _ops().grouped_matmul(x, weight, group_list, GROUP_LIST_COUNT, False,
                                  expanded_row_idx, ROW_IDX_GATHER, topk)
        ctx.save_for_backward(x, weight, expanded_row_idx, group_list)
        ctx.topk = topk
        ctx.weight = weight if fuse_grad else None  # the parameter whose .grad takes d_weight
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, idx, groups = ctx.saved_tensors
        dy = dy.to(weight.dtype)
        want_dx, want_dw = ctx.needs_input_grad[0:2]
        dx = dw = None
        if want_dx:
            dx = _ops().moe_init_routing_grouped_matmul_grad(
                dy, weight, idx, groups, x.shape[0], ctx.topk, ROW_IDX_GATHER,
                GROUP_LIST_COUNT).to(x.dtype)
        if want_dw:  # written in place (into weight.grad with the fusion)
            fused = ctx.weight is not None
            sink = _WeightGradSink(ctx.weight if fused else weight, fused)
            sink.write(0, weight.shape[0], x, dy, groups, idx, ROW_IDX_GATHER, ctx.topk)
            dw = sink.result()
        return dx, dw, None, None, None, None


def moe_grouped_linear(x, expert_idx, weight, capacity=0, routing=None,
                       grad_accumulation_fusion=False):
    """The first expert matmul of an MoE layer: ``(y, routing)``.

    x [batch, H], expert_idx [batch, topk] (int32/int64, values in [0, G)), weight [G, H, F]
    -> y [M, F] in expanded order (rows grouped by expert, then by slot). Pass ``routing`` to
    reuse one (then expert_idx and capacity are not read).

    grad_accumulation_fusion: the backward adds d_weight straight into ``weight.grad`` (a leaf
    weight; see MoeFFN) instead of returning it to autograd.
    """
    _check_float("x", x)
    if routing is None:
        routing = moe_route(x, expert_idx, weight.shape[0], capacity)
    y = _GroupedLinearGather.apply(x, weight, routing.expanded_row_idx, routing.group_list,
                                   routing.topk, bool(grad_accumulation_fusion))
    return y, routing


class _ExpertLinear(torch.autograd.Function):
    """y[i] = h[i] @ weight[g(i)] on rows already in expanded order."""

    @staticmethod
    def forward(ctx, h, weight, group_list):
        y = _ops().grouped_matmul(h, weight, group_list, GROUP_LIST_COUNT)
        ctx.save_for_backward(h, weight, group_list)
        return y

    @staticmethod
    def backward(ctx, dy):
        h, weight, groups = ctx.saved_tensors
        dy = dy.to(weight.dtype)
        dh = dw = None
        if ctx.needs_input_grad[0]:
            dh = _ops().grouped_matmul(dy, weight, groups, GROUP_LIST_COUNT, True)
        if ctx.needs_input_grad[1]:
            dw = _ops().grouped_matmul_weight_grad(h, dy, groups, GROUP_LIST_COUNT,
                                                   out_dtype=weight.dtype)
        return dh, dw, None


def moe_expert_linear(h, routing, weight):
    """A further expert matmul: h [M, F] in expanded order, weight [G, F, N] -> [M, N]."""
    _check_float("h", h)
    return _ExpertLinear.apply(h, weight, routing.group_list)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, probs, expanded_row_idx):
        out = _ops().moe_finalize_routing(y, probs, expanded_row_idx, ROW_IDX_GATHER)
        ctx.save_for_backward(y, probs, expanded_row_idx)
        return out

    @staticmethod
    def backward(ctx, dout):
        y, probs, idx = ctx.saved_tensors
        dy, dprobs = _ops().moe_finalize_routing_grad(dout.to(y.dtype), y, probs, idx,
                                                      ROW_IDX_GATHER)
        return dy, dprobs, None


def moe_combine(y, probs, routing):
    """out[b] = sum over j of probs[b, j] * y[row of slot b * topk + j] -> [batch, N].

    y [M, N] in expanded order; probs [batch, topk] (float32 or y's dtype). Dropped slots add
    nothing. Gradients flow to y and probs.
    """
    _check_float("y", y)
    return _Combine.apply(y, probs, routing.expanded_row_idx)
