"""MoeFFN: a mixture-of-experts feed-forward layer on gradkit's operators, and the same layer in
plain PyTorch (TorchMoeFFN) to check it against and to measure it beside.

    logits = router(x)                    [batch, G]
    top-k of the logits -> expert_idx     [batch, k];  probs = softmax over the k chosen logits
    h = x[token(i)] @ W1[g(i)]            [M, F]   (expanded rows, grouped by expert)
    y = act(h) @ W2[g(i)]                 [M, H]
    out[b] = sum over j of probs[b, j] * y[row of slot b * k + j]

What MoeFFN keeps for the backward: h and y (besides x and the parameters). act(h) is
recomputed in the backward (an elementwise op), the expanded x is never made, and d_x comes from
the fused operator without its [M, H] intermediate. TorchMoeFFN keeps, per expert, the gathered
x, h, act(h) and y, as autograd does for its ops.
"""
import math

import torch
import torch.nn.functional as F

from gradkit.torch import functional as gkf

_ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "elu": F.elu,
}


def _activation(activation):
    if callable(activation):
        return activation
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation is {activation!r}; it must be a callable or one of "
                         f"{sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[activation]


class _MoeExperts(torch.autograd.Function):
    """act(x[token(i)] @ W1[g(i)]) @ W2[g(i)], keeping only h = x @ W1 for the backward."""

    @staticmethod
    def forward(ctx, x, w1, w2, expanded_row_idx, group_list, topk, act):
        ops = gkf._ops()
        h = ops.grouped_matmul(x, w1, group_list, gkf.GROUP_LIST_COUNT, False, expanded_row_idx,
                               gkf.ROW_IDX_GATHER, topk)
        y = ops.grouped_matmul(act(h), w2, group_list, gkf.GROUP_LIST_COUNT)
        ctx.save_for_backward(x, w1, w2, expanded_row_idx, group_list, h)
        ctx.topk, ctx.act = topk, act
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w1, w2, idx, groups, h = ctx.saved_tensors
        ops = gkf._ops()
        dy = dy.to(w2.dtype)
        with torch.enable_grad():
            h_leaf = h.detach().requires_grad_()
            a = ctx.act(h_leaf)
        dw2 = None
        if ctx.needs_input_grad[2]:
            dw2 = ops.grouped_matmul_weight_grad(a.detach(), dy, groups, gkf.GROUP_LIST_COUNT,
                                                 out_dtype=w2.dtype)
        da = ops.grouped_matmul(dy, w2, groups, gkf.GROUP_LIST_COUNT, True)
        (dh,) = torch.autograd.grad(a, h_leaf, da)
        del a, da, h_leaf
        dh = dh.to(w1.dtype)
        dx = dw1 = None
        if ctx.needs_input_grad[0]:
            dx = ops.moe_init_routing_grouped_matmul_grad(
                dh, w1, idx, groups, x.shape[0], ctx.topk, gkf.ROW_IDX_GATHER,
                gkf.GROUP_LIST_COUNT).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw1 = ops.grouped_matmul_weight_grad(x, dh, groups, gkf.GROUP_LIST_COUNT, idx,
                                                 gkf.ROW_IDX_GATHER, ctx.topk, w1.dtype)
        return dx, dw1, dw2, None, None, None, None


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
        self.activation = _activation(activation)
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
    [G, H, F], w2 [G, F, H]. activation: "gelu", "relu", "silu", "elu" or a callable (elementwise)."""

    def experts(self, x, expert_idx, probs):
        routing = gkf.moe_route(x, expert_idx, self.num_experts, self.capacity)
        y = _MoeExperts.apply(x, self.w1, self.w2, routing.expanded_row_idx, routing.group_list,
                              routing.topk, self.activation)
        return gkf.moe_combine(y, probs.to(x.dtype), routing)


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
