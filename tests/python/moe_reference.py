"""Plain-PyTorch float64 references for the MoE operators (routing, expert matmuls, combine),
written from the conventions in the C headers: slot p = b * topk + j; expanded rows grouped by
expert ascending, then by slot; capacity keeps each expert's first slots."""
import torch

# Relative spacing of each dtype (the rounding of a result to it is within half of this).
EPS = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def make_expert_idx(batch, topk, experts, skew=0.0, empty=(), seed=0):
    """[batch, topk] int64, distinct experts per token; `skew` in [0, 1) makes expert 0..
    increasingly popular; experts in `empty` are never chosen."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.tensor([(1 - skew) ** g for g in range(experts)], dtype=torch.float64)
    for g in empty:
        weights[g] = 0
    assert int((weights > 0).sum()) >= topk
    return torch.multinomial(weights.expand(batch, experts), topk, replacement=False,
                             generator=gen)


def route(expert_idx, experts, capacity=0):
    """(row_slot [M], counts [G]): the kept slots in expanded order, and rows per expert."""
    flat = expert_idx.reshape(-1).to(torch.int64)
    rows, counts = [], []
    for g in range(experts):
        slots = torch.nonzero(flat == g).squeeze(1)  # ascending slot order
        if capacity > 0:
            slots = slots[:capacity]
        rows.append(slots)
        counts.append(slots.numel())
    return torch.cat(rows), torch.tensor(counts, dtype=torch.int64)


def expert_of_rows(counts):
    return torch.repeat_interleave(torch.arange(counts.numel()), counts)


def grouped_mm(a, w, counts):
    """a [M, K] @ w[g] [K, N] per expert's rows, in float64."""
    expert = expert_of_rows(counts)
    return torch.einsum("mk,mkn->mn", a.double(), w.double()[expert])


def matmul_bound(a, w, counts, dtype, out_dtype=None):
    """|error| bound of a float32-accumulated product rounded once to out_dtype: K float32
    roundings of |a| @ |w| plus one rounding of the result."""
    k = a.shape[1]
    mag = grouped_mm(a.abs(), w.abs(), counts)
    out_eps = EPS[out_dtype or dtype]
    return (k + 2) * EPS[torch.float32] * mag + out_eps * mag + 1e-30


def combine(y, probs, row_slot, batch, topk):
    """out[b] = sum over kept j of probs[b, j] * y[row of slot b * topk + j], in float64."""
    out = torch.zeros(batch, y.shape[1], dtype=torch.float64)
    token = torch.div(row_slot, topk, rounding_mode="floor")
    out.index_add_(0, token, y.double() * probs.double().reshape(-1)[row_slot].unsqueeze(1))
    return out
