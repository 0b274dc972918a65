"""MoeFFN: a mixture-of-experts feed-forward layer on gradkit's operators, and the same layer in
plain PyTorch (TorchMoeFFN) to check it against and to measure it beside.

    logits = router(x)                    [batch, G]
    top-k of the logits -> expert_idx     [batch, k];  probs = softmax over the k chosen logits
    h = x[token(i)] @ W1[g(i)]            [M, F]   (expanded rows, grouped by expert)
    y = act(h) @ W2[g(i)]                 [M, H]
    out[b] = sum over j of probs[b, j] * y[row of slot b * k + j]

What MoeFFN keeps for the backward: h (besides x, probs, the routing and the parameters), not
y: act(h) is recomputed in the backward (an elementwise op), the expanded x is never made, d_x
comes from the fused operator without its [M, H] intermediate, and the second matmul and the
combine are one node whose backward reads d_out through the routing, so y is not kept and its
[M, H] gradient is made one chunk of experts at a time (the gradient of probs comes from
(d_out @ W2^T) . act(h), which equals d_out . y). That node runs over chunks of experts, so
act(h) and the other [rows, *] temporaries are bounded (expert_chunks; a chunk is at least one
expert), and the two expert matmuls are autograd nodes of their own, so d_W2 is added into
w2.grad before d_W1 is made.
TorchMoeFFN keeps, per expert, the gathered x, h, act(h) and y, as autograd does for its ops.
"""
import math

import torch
import torch.nn.functional as F

from gradkit.torch import functional as gkf

def _elu_backward(grad, h, out=None):
    dh = gkf._ops().elu_grad_v2(grad, h, 1.0, 1.0, 1.0, False)
    return dh if out is None else out.copy_(dh)


def _aten_backward(op, *args):
    """backward(grad, h, out=None) through an aten op and, with out, its out= overload (which
    may write over h itself: the ops are elementwise)."""
    def backward(grad, h, out=None):
        if out is None:
            return op.default(grad, h, *args)
        return op.grad_input(grad, h, *args, grad_input=out)
    return backward


# Each activation with the backward that needs only its input (so act(h) need not be kept).
_ACTIVATIONS = {
    "gelu": (F.gelu, _aten_backward(torch.ops.aten.gelu_backward)),
    "relu": (F.relu, _aten_backward(torch.ops.aten.threshold_backward, 0)),
    "silu": (F.silu, _aten_backward(torch.ops.aten.silu_backward)),
    "elu": (F.elu, _elu_backward),
}


def _activation(activation):
    """(forward, backward(grad, h) or None): a callable's backward comes from autograd."""
    if callable(activation):
        return activation, None
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation is {activation!r}; it must be a callable or one of "
                         f"{sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[activation]


def _activation_grad(act, act_backward, grad, h, out=None):
    """d act(h) / d h times grad, into out when given (which may be h itself)."""
    if act_backward is not None:
        return act_backward(grad, h, out=out)
    with torch.enable_grad():
        h_leaf = h.detach().requires_grad_()
        (dh,) = torch.autograd.grad(act(h_leaf), h_leaf, grad)
    return dh if out is None else out.copy_(dh)


def _row_dots(u, a, block=256):
    """float32 [rows]: each row of u dotted with the same row of a, summed in float32, a block of
    rows at a time (the products of one block are the only temporary)."""
    dots = torch.empty(u.shape[0], dtype=torch.float32)
    for r in range(0, u.shape[0], block):
        torch.sum(u[r:r + block].float() * a[r:r + block].float(), dim=1, out=dots[r:r + block])
    return dots


class _ExpertsDownCombine(torch.autograd.Function):
    """out[b] = sum over j of probs[b, j] * (act(h) @ W2[g])[row of slot b * k + j]: the second
    expert matmul and the combine in one node, keeping h only (not y, not act(h)).

    Forward: y = act(h) @ W2 chunk by chunk of experts, then finalize; y is freed on return.
    Backward, chunk by chunk, from d_out [batch, H] read through the routing, so the [M, H] d_y
    of a separate combine is made one chunk of experts at a time (whole only when the chunk
    is every expert: a small layer, or one expert holding most rows):
        u     = d_out[token(i)] @ W2[g]^T     (gather-fused grouped matmul, [rows, F])
        dprob = u . act(h)[i]                 (= d_out[token] . y[i], without keeping y)
        d_h   = act'(h) * (prob * u)          (written over the saved h)
        d_W2 += act(h)^T @ (prob * d_out[token])   (the chunk's d_y rows: its one [rows, H])
    Chunks hold about CHUNK_BYTES of [rows, max(F, H)] (at least one expert).
    A second backward through the same graph (retain_graph) is refused by autograd's check of
    modified saved tensors, since d_h takes h's place."""

    @staticmethod
    def forward(ctx, h, w2, probs, expanded_row_idx, group_list, topk, act, act_backward,
                fuse_grad=False):
        ops = gkf._ops()
        # Chunks bound act(h) [rows, F] and the chunk's d_y [rows, H] alike.
        row_bytes = max(h.shape[1], w2.shape[2]) * h.element_size()
        chunks = gkf.expert_chunks(group_list.tolist(), row_bytes)
        y = h.new_empty(h.shape[0], w2.shape[2])
        for g0, g1, r0, r1 in chunks:  # each chunk's rows written in place (out=)
            ops.grouped_matmul.out(act(h[r0:r1]), w2[g0:g1], group_list[g0:g1],
                                   gkf.GROUP_LIST_COUNT, out=y[r0:r1])
        out = ops.moe_finalize_routing(y, probs, expanded_row_idx, gkf.ROW_IDX_GATHER)
        ctx.save_for_backward(h, w2, probs, expanded_row_idx, group_list)
        ctx.act, ctx.act_backward, ctx.chunks, ctx.topk = act, act_backward, chunks, topk
        ctx.w2 = w2 if fuse_grad else None  # the parameter whose .grad takes d_W2
        return out

    @staticmethod
    def backward(ctx, dout):
        h, w2, probs, idx, groups = ctx.saved_tensors
        ops = gkf._ops()
        dout = dout.to(w2.dtype).contiguous()
        want_dh, want_dw2, want_dprobs = ctx.needs_input_grad[0:3]
        flat_probs = probs.reshape(-1).to(w2.dtype)
        dprobs = torch.zeros(flat_probs.shape[0], dtype=torch.float32) if want_dprobs else None
        # float16: u in float32, so that the unweighted d_out @ W2^T cannot overflow where
        # prob * d_out did not (loss scaling); its product with prob is rounded once.
        u_dtype = torch.float32 if w2.dtype == torch.float16 else None
        # Each chunk's experts written in place (into w2.grad with the fusion).
        fused = ctx.w2 is not None
        dw2 = gkf._WeightGradSink(ctx.w2 if fused else w2, fused) if want_dw2 else None
        for g0, g1, r0, r1 in ctx.chunks:
            counts, h_c, slots = groups[g0:g1], h[r0:r1], idx[r0:r1]
            prob = flat_probs.index_select(0, slots).unsqueeze(1)
            a_c = ctx.act(h_c) if want_dw2 or want_dprobs else None
            if want_dw2:
                dy_c = dout.index_select(0, torch.div(slots, ctx.topk, rounding_mode="floor"))
                dy_c.mul_(prob)
                dw2.write(g0, g1, a_c, dy_c, counts)
                del dy_c
                if not want_dprobs:
                    a_c = None
            if want_dh or want_dprobs:
                u = ops.grouped_matmul(dout, w2[g0:g1], counts, gkf.GROUP_LIST_COUNT, True,
                                       slots, gkf.ROW_IDX_GATHER, ctx.topk, u_dtype)
                if want_dprobs:
                    dprobs.index_copy_(0, slots.long(), _row_dots(u, a_c))
                a_c = None
                if want_dh:
                    # h's rows are not read again: d_h takes their place (no second [M, F]).
                    da = u.mul_(prob).to(h.dtype)
                    del u
                    _activation_grad(ctx.act, ctx.act_backward, da, h_c, out=h_c)
                    del da
                u = None
        if dprobs is not None:
            dprobs = dprobs.to(probs.dtype).reshape(probs.shape)
        return (h if want_dh else None, None if dw2 is None else dw2.result(), dprobs,
                None, None, None, None, None, None)


def top_k_gating(logits, topk):
    """expert_idx [batch, k] (int64) and probs [batch, k]: softmax over the k largest logits."""
    values, expert_idx = torch.topk(logits, topk, dim=-1)
    return expert_idx, torch.softmax(values, dim=-1)


class _MoeFFNBase(torch.nn.Module):
    def __init__(self, hidden, ffn_hidden, num_experts, topk, activation="gelu", capacity=0,
                 dtype=None):
        super().__init__()
        if not 1 <= topk <= num_experts:
            raise ValueError(f"topk is {topk}; it must be in [1, num_experts = {num_experts}]")
        if capacity < 0:
            raise ValueError(f"capacity is {capacity}; it must be >= 0 (0 keeps every slot)")
        self.hidden, self.ffn_hidden = hidden, ffn_hidden
        self.num_experts, self.topk, self.capacity = num_experts, topk, capacity
        self.activation, self._activation_backward = _activation(activation)
        self.router = torch.nn.Linear(hidden, num_experts, bias=False, dtype=dtype)
        self.w1 = torch.nn.Parameter(torch.empty(num_experts, hidden, ffn_hidden, dtype=dtype))
        self.w2 = torch.nn.Parameter(torch.empty(num_experts, ffn_hidden, hidden, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        # As nn.Linear initialises each expert's two matrices (fan-in bounds).
        torch.nn.init.uniform_(self.w1, -1 / math.sqrt(self.hidden), 1 / math.sqrt(self.hidden))
        torch.nn.init.uniform_(self.w2, -1 / math.sqrt(self.ffn_hidden),
                               1 / math.sqrt(self.ffn_hidden))

    def gate(self, x):
        return top_k_gating(self.router(x), self.topk)

    def forward(self, x):
        shape = x.shape
        tokens = x.reshape(-1, self.hidden)
        expert_idx, probs = self.gate(tokens)
        return self.experts(tokens, expert_idx, probs).reshape(shape)


class MoeFFN(_MoeFFNBase):
    """The MoE FFN on gradkit's operators (CPU). Parameters: router [G, H] (nn.Linear), w1
    [G, H, F], w2 [G, F, H]. activation: "gelu", "relu", "silu", "elu" or a callable (elementwise).

    grad_accumulation_fusion (opt-in, as Megatron-LM's): the backward adds the expert weights'
    gradients straight into ``w1.grad`` and ``w2.grad`` (made when None) with
    ``grouped_matmul_weight_grad_add_``, and hands autograd None for them. No temporary of a
    weight's size exists, which is most of the step's peak at a few thousand tokens. What it
    gives up: ``torch.autograd.grad`` with respect to w1 / w2 and hooks on their gradients (DDP's
    included) do not see those gradients.
    """

    def __init__(self, *args, grad_accumulation_fusion=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.grad_accumulation_fusion = grad_accumulation_fusion

    def experts(self, x, expert_idx, probs):
        routing = gkf.moe_route(x, expert_idx, self.num_experts, self.capacity)
        # Two autograd nodes, so that autograd adds d_W2 into w2.grad (and frees it) before d_W1
        # is made: a layer's two weight gradients never exist as temporaries at once.
        fuse = bool(self.grad_accumulation_fusion)
        h = gkf._GroupedLinearGather.apply(x, self.w1, routing.expanded_row_idx,
                                           routing.group_list, routing.topk, fuse)
        return _ExpertsDownCombine.apply(h, self.w2, probs.to(x.dtype), routing.expanded_row_idx,
                                         routing.group_list, routing.topk, self.activation,
                                         self._activation_backward, fuse)


class TorchMoeFFN(_MoeFFNBase):
    """The same layer in plain PyTorch (per-expert index_select, mm, index_add_), same parameters:
    the reference MoeFFN is tested against and the peer it is measured beside."""

    def experts(self, x, expert_idx, probs):
        out = torch.zeros_like(x)
        slots = expert_idx.reshape(-1)
        weights = probs.to(x.dtype).reshape(-1)
        # One unbind, not w1[g] per expert: each select's backward would fill and add a whole
        # [G, H, F] gradient, which dominated this layer's step time and memory.
        w1, w2 = self.w1.unbind(0), self.w2.unbind(0)
        for g in range(self.num_experts):
            slot = torch.nonzero(slots == g).squeeze(1)  # in slot order
            if self.capacity > 0:
                slot = slot[:self.capacity]
            if slot.numel() == 0:
                continue
            token = torch.div(slot, self.topk, rounding_mode="floor")
            h = x.index_select(0, token) @ w1[g]
            y = self.activation(h) @ w2[g]
            out.index_add_(0, token, y * weights[slot].unsqueeze(1))
        return out
