"""torch.ops.gradkit.*: each operator against plain PyTorch (aten.elu_backward, per-expert mm,
index_add_) and float64 references, over dtypes, routings and conventions; errors; determinism."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import moe_reference as ref
from elu_reference import CASES, float64_formula, tolerance, torch_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SUBNORMAL = {torch.float32: 2.0 ** -149, torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133}

# (batch, topk, experts, skew, empty experts, capacity)
ROUTINGS = [
    (37, 2, 5, 0.0, (), 0),
    (64, 4, 8, 0.7, (), 0),          # skewed
    (40, 1, 6, 0.95, (), 0),         # nearly every row on expert 0
    (50, 2, 9, 0.0, (0, 3, 8), 0),   # empty experts, first and last among them
    (23, 8, 16, 0.2, (5,), 0),
    (60, 2, 4, 0.5, (), 7),          # capacity drops
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha,scale,input_scale,is_result", CASES)
def test_elu_grad_v2_matches_aten(gkt, dtype, alpha, scale, input_scale, is_result):
    rng = np.random.default_rng(7)
    dy = rng.uniform(-3, 3, (33, 70)).astype(np.float32)
    x = rng.uniform(-6, 4, (33, 70)).astype(np.float32)
    if is_result:
        x = np.maximum(x, -alpha * scale + 1e-3).astype(np.float32)
    got = gkt.ops.elu_grad_v2(torch.from_numpy(dy).to(dtype), torch.from_numpy(x).to(dtype),
                              alpha, scale, input_scale, is_result)
    assert got.dtype == dtype and got.shape == dy.shape
    expected, dy64, x64 = torch_reference(dy, x, alpha, scale, input_scale, is_result, dtype)
    exact = float64_formula(dy64, x64, alpha, scale, input_scale, is_result)
    bound = tolerance(exact, x64, input_scale, ref.EPS[dtype], SUBNORMAL[dtype])
    got64 = got.double().numpy()
    assert np.all(np.abs(got64 - expected) <= bound)
    assert np.all(np.abs(got64 - exact) <= bound)


def test_elu_grad_v2_takes_strided_views_as_they_are(gkt):
    dy = torch.randn(48, 64).t()          # transposed: not contiguous
    x = torch.randn(96, 64)[::2].t()      # every other row (48 of them), transposed
    got = gkt.ops.elu_grad_v2(dy, x, 1.0, 1.0, 1.0, False)
    want = torch.ops.aten.elu_backward(dy, 1.0, 1.0, 1.0, False, x)
    torch.testing.assert_close(got, want, rtol=4 * 2.0 ** -23, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("row_idx_type", [0, 1])
def test_moe_init_routing_matches_a_stable_sort(gkt, dtype, routing, row_idx_type):
    batch, topk, experts, skew, empty, capacity = routing
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch)
    x = torch.randn(batch, 24).to(dtype)
    ex, idx, groups = gkt.ops.moe_init_routing(x, expert_idx, capacity, experts, 0, row_idx_type)
    row_slot, counts = ref.route(expert_idx, experts, capacity)
    assert torch.equal(groups, counts)
    assert torch.equal(ex, x[torch.div(row_slot, topk, rounding_mode="floor")])
    if row_idx_type == 0:
        assert torch.equal(idx, row_slot)
    else:
        want = torch.full((batch * topk,), -1, dtype=torch.int64)
        want[row_slot] = torch.arange(row_slot.numel())
        assert torch.equal(idx, want)
    # The index-only form gives the same indices; cumsum is the running total.
    idx2, cumsum = gkt.ops.moe_init_routing_index(x, expert_idx, capacity, experts, 1,
                                                  row_idx_type)
    assert torch.equal(idx2, idx) and torch.equal(cumsum, torch.cumsum(counts, 0))


def test_moe_init_routing_keeps_int32_indices(gkt):
    expert_idx = ref.make_expert_idx(16, 2, 4, seed=3).int()
    _, idx, groups = gkt.ops.moe_init_routing(torch.randn(16, 8), expert_idx, 0, 4)
    assert idx.dtype == torch.int32 and groups.dtype == torch.int64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", ROUTINGS)
def test_grouped_matmul_plain_gathered_and_transposed(gkt, dtype, routing):
    batch, topk, experts, skew, empty, capacity = routing
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch + 1)
    row_slot, counts = ref.route(expert_idx, experts, capacity)
    k, n = 40, 33
    x = torch.randn(batch, k).to(dtype)
    w = (torch.randn(experts, k, n) / 4).to(dtype)
    ex = x[torch.div(row_slot, topk, rounding_mode="floor")]
    want = ref.grouped_mm(ex, w, counts)
    bound = ref.matmul_bound(ex, w, counts, dtype)
    plain = gkt.ops.grouped_matmul(ex, w, counts)
    assert plain.dtype == dtype
    assert torch.all((plain.double() - want).abs() <= bound)
    # Gather-fused: x read through the routing, the same bits as the plain call.
    gathered = gkt.ops.grouped_matmul(x, w, counts, 0, False, row_slot, 0, topk)
    assert torch.equal(gathered, plain)
    # nn.Linear's layout [G, N, K] with transpose_weight, and float32 out.
    out32 = gkt.ops.grouped_matmul(ex, w.transpose(1, 2).contiguous(), torch.cumsum(counts, 0),
                                   1, True, out_dtype=torch.float32)
    assert out32.dtype == torch.float32
    assert torch.all((out32.double() - want).abs() <= ref.matmul_bound(ex, w, counts, dtype,
                                                                          torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", ROUTINGS)
def test_grouped_matmul_weight_grad(gkt, dtype, routing):
    batch, topk, experts, skew, empty, capacity = routing
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch + 2)
    row_slot, counts = ref.route(expert_idx, experts, capacity)
    x = torch.randn(batch, 20).to(dtype)
    ex = x[torch.div(row_slot, topk, rounding_mode="floor")]
    dy = torch.randn(row_slot.numel(), 28).to(dtype)
    dw = gkt.ops.grouped_matmul_weight_grad(ex, dy, counts, out_dtype=torch.float32)
    expert = ref.expert_of_rows(counts)
    want = torch.zeros(experts, 20, 28, dtype=torch.float64)
    mag = torch.zeros_like(want)
    want.index_add_(0, expert, ex.double().unsqueeze(2) * dy.double().unsqueeze(1))
    mag.index_add_(0, expert, ex.double().abs().unsqueeze(2) * dy.double().abs().unsqueeze(1))
    rows = max(int(counts.max()), 1)
    assert torch.all((dw.double() - want).abs() <= (rows + 2) * 2.0 ** -23 * mag + 1e-30)
    for g in empty:
        assert torch.all(dw[g] == 0)
    gathered = gkt.ops.grouped_matmul_weight_grad(x, dy, counts, 0, row_slot, 0, topk,
                                                  torch.float32)
    assert torch.equal(gathered, dw)
    assert gkt.ops.grouped_matmul_weight_grad(ex, dy, counts).dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_variants_write_the_callers_slices(gkt, dtype):
    """grouped_matmul.out / grouped_matmul_weight_grad.out: the same bits as the plain ops,
    written into a row slice / expert slice of a larger tensor, nothing else touched."""
    batch, topk, experts = 50, 2, 6
    expert_idx = ref.make_expert_idx(batch, topk, experts, 0.3, (2,), seed=11)
    row_slot, counts = ref.route(expert_idx, experts, 0)
    x = torch.randn(batch, 24).to(dtype)
    w = (torch.randn(experts, 24, 40) / 4).to(dtype)
    m = row_slot.numel()
    y = gkt.ops.grouped_matmul(x, w, counts, 0, False, row_slot, 0, topk)
    big = torch.full((m + 7, 40), 7.0, dtype=dtype)
    got = gkt.ops.grouped_matmul.out(x, w, counts, 0, False, row_slot, 0, topk, out=big[3:3 + m])
    assert got.data_ptr() == big[3:].data_ptr()
    assert torch.equal(big[3:3 + m], y)
    assert torch.all(big[:3] == 7) and torch.all(big[3 + m:] == 7)
    # float32 out: the dtype of out is the result's.
    y32 = gkt.ops.grouped_matmul(x, w, counts, 0, False, row_slot, 0, topk, torch.float32)
    out32 = torch.empty(m, 40)
    gkt.ops.grouped_matmul.out(x, w, counts, 0, False, row_slot, 0, topk, out=out32)
    assert torch.equal(out32, y32)
    # Weight grad into experts [1, 1 + G) of a larger gradient.
    dy = torch.randn(m, 40).to(dtype)
    dw = gkt.ops.grouped_matmul_weight_grad(x, dy, counts, 0, row_slot, 0, topk)
    grad = torch.full((experts + 2, 24, 40), 7.0, dtype=dtype)
    gkt.ops.grouped_matmul_weight_grad.out(x, dy, counts, 0, row_slot, 0, topk,
                                           out=grad[1:1 + experts])
    assert torch.equal(grad[1:1 + experts], dw)
    assert torch.all(grad[0] == 7) and torch.all(grad[-1] == 7)
    # A strided out is refused by name; a wrong shape by gradkit's check, out untouched.
    with pytest.raises(RuntimeError, match=r"grouped_matmul\.out: out has strides .*contiguous"):
        gkt.ops.grouped_matmul.out(x, w, counts, 0, False, row_slot, 0, topk,
                                   out=torch.empty(40, m, dtype=dtype).t())
    short = torch.full((m - 1, 40), 7.0, dtype=dtype)
    with pytest.raises(RuntimeError, match=rf"grouped_matmul\.out: .*M = {m - 1} rows of y"):
        gkt.ops.grouped_matmul.out(x, w, counts, 0, False, row_slot, 0, topk, out=short)
    assert torch.all(short == 7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_grad_add_adds_the_float32_sum_rounded_once(gkt, dtype):
    """grouped_matmul_weight_grad_add_: self becomes (self as float32 + the float32 weight
    gradient) rounded once to self's dtype, in place; an empty expert keeps its bits; errors
    leave self untouched."""
    batch, topk, experts = 300, 2, 5
    expert_idx = ref.make_expert_idx(batch, topk, experts, 0.3, (2,), seed=12)
    row_slot, counts = ref.route(expert_idx, experts, 0)
    m = row_slot.numel()
    x = torch.randn(batch, 24).to(dtype)
    dy = torch.randn(m, 40).to(dtype)
    total = gkt.ops.grouped_matmul_weight_grad(x, dy, counts, 0, row_slot, 0, topk, torch.float32)
    for grad_dtype in {torch.float32, dtype}:
        grad = (torch.randn(experts, 24, 40) * 3).to(grad_dtype)
        grad[2, 0, 0] = -0.0
        before = grad.clone()
        got = gkt.ops.grouped_matmul_weight_grad_add_(grad, x, dy, counts, 0, row_slot, 0, topk)
        assert got.data_ptr() == grad.data_ptr()
        want = (before.float() + total).to(grad_dtype)
        want[2] = before[2]  # expert 2 has no rows
        assert torch.equal(grad.view(torch.int16 if grad.element_size() == 2 else torch.int32),
                           want.view(torch.int16 if want.element_size() == 2 else torch.int32))
        # Twice the same call adds twice: the caller's accumulation, as autograd's.
        gkt.ops.grouped_matmul_weight_grad_add_(grad, x, dy, counts, 0, row_slot, 0, topk)
        assert torch.equal(grad, (want.float() + total).to(grad_dtype).where(
            torch.arange(experts).view(-1, 1, 1) != 2, want))
    bad = torch.full((experts, 40, 24), 7.0, dtype=dtype)
    with pytest.raises(RuntimeError, match=r"grouped_matmul_weight_grad_add_: .*gradWeightRef"):
        gkt.ops.grouped_matmul_weight_grad_add_(bad, x, dy, counts, 0, row_slot, 0, topk)
    assert torch.all(bad == 7)
    with pytest.raises(RuntimeError, match=r"self has strides .*contiguous"):
        gkt.ops.grouped_matmul_weight_grad_add_(torch.empty(experts, 40, 24, dtype=dtype)
                                                .transpose(1, 2), x, dy, counts, 0, row_slot, 0,
                                                topk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("row_idx_type", [0, 1])
def test_moe_finalize_routing_and_grad(gkt, dtype, routing, row_idx_type):
    batch, topk, experts, skew, empty, capacity = routing
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch + 3)
    _, idx, _ = gkt.ops.moe_init_routing(torch.zeros(batch, 1), expert_idx, capacity, experts, 0,
                                         row_idx_type)
    row_slot, _ = ref.route(expert_idx, experts, capacity)
    m, n = row_slot.numel(), 19
    y = torch.randn(m, n).to(dtype)
    probs = torch.rand(batch, topk)
    out = gkt.ops.moe_finalize_routing(y, probs, idx, row_idx_type, torch.float32)
    want = ref.combine(y, probs, row_slot, batch, topk)
    assert torch.all((out.double() - want).abs() <= (topk + 1) * 2.0 ** -23 * want.abs() + 1e-6)

    dout = torch.randn(batch, n).to(dtype)
    dy, dprobs = gkt.ops.moe_finalize_routing_grad(dout, y, probs, idx, row_idx_type)
    assert dy.dtype == dtype and dprobs.dtype == torch.float32
    token = torch.div(row_slot, topk, rounding_mode="floor")
    want_dy = probs.double().reshape(-1)[row_slot].unsqueeze(1) * dout.double()[token]
    assert torch.all((dy.double() - want_dy).abs() <= ref.EPS[dtype] * want_dy.abs() + SUBNORMAL[dtype])
    want_dp = torch.zeros(batch * topk, dtype=torch.float64)
    want_dp[row_slot] = (dout.double()[token] * y.double()).sum(1)
    mag = (dout.double()[token] * y.double()).abs().sum(1)
    err = (dprobs.double().reshape(-1)[row_slot] - want_dp[row_slot]).abs()
    assert torch.all(err <= (n + 2) * 2.0 ** -23 * mag + 1e-30)
    dropped = torch.ones(batch * topk, dtype=torch.bool)
    dropped[row_slot] = False
    assert torch.all(dprobs.reshape(-1)[dropped] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("routing", ROUTINGS)
def test_fused_grad_matches_the_torch_composite(gkt, dtype, routing):
    batch, topk, experts, skew, empty, capacity = routing
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch + 4)
    row_slot, counts = ref.route(expert_idx, experts, capacity)
    k, n = 48, 36
    dy = torch.randn(row_slot.numel(), n).to(dtype)
    w = (torch.randn(experts, k, n) / 4).to(dtype)
    dx = gkt.ops.moe_init_routing_grouped_matmul_grad(dy, w, row_slot, counts, batch, topk, 0)
    assert dx.dtype == torch.float32 and dx.shape == (batch, k)
    # The composite the fused operator replaces: per-expert mm, then index_add_ into the tokens.
    token = torch.div(row_slot, topk, rounding_mode="floor")
    d_expanded = ref.grouped_mm(dy, w.transpose(1, 2), counts)
    want = torch.zeros(batch, k, dtype=torch.float64).index_add_(0, token, d_expanded)
    mag = torch.zeros(batch, k, dtype=torch.float64).index_add_(
        0, token, ref.grouped_mm(dy.abs(), w.abs().transpose(1, 2), counts))
    assert torch.all((dx.double() - want).abs() <= (n + topk + 2) * 2.0 ** -23 * mag + 1e-30)
    # nn.Linear's layout read in place (transposed view): the same bits.
    w_nk = w.transpose(1, 2).contiguous()
    dx_view = gkt.ops.moe_init_routing_grouped_matmul_grad(dy, w_nk.transpose(1, 2), row_slot,
                                                           counts, batch, topk, 0)
    assert torch.equal(dx_view, dx)


def test_results_are_the_same_bytes_for_every_thread_count(gkt):
    expert_idx = ref.make_expert_idx(300, 2, 8, 0.6, seed=11)
    row_slot, counts = ref.route(expert_idx, 8)
    dy = torch.randn(row_slot.numel(), 96)
    w = torch.randn(8, 80, 96)
    x = torch.randn(300, 80)
    results = []
    for threads in (1, 2, 3, 4, 0):
        gkt.ops.set_num_threads(threads)
        results.append((
            gkt.ops.moe_init_routing_grouped_matmul_grad(dy, w, row_slot, counts, 300, 2, 0),
            gkt.ops.grouped_matmul_weight_grad(x, dy, counts, 0, row_slot, 0, 2),
            gkt.ops.grouped_matmul(x, w.transpose(1, 2), counts, 0, True, row_slot, 0, 2)))
    for got in results[1:]:
        for a, b in zip(got, results[0]):
            assert torch.equal(a, b)


def test_errors_carry_gradkits_message(gkt):
    w = torch.randn(4, 8, 6)
    dy = torch.randn(10, 6)
    counts = torch.tensor([3, 3, 2, 2])
    idx = torch.arange(10)
    with pytest.raises(RuntimeError, match=r"gradkit\.moe_init_routing_grouped_matmul_grad: .*"
                                           r"groupList"):
        gkt.ops.moe_init_routing_grouped_matmul_grad(dy, w, idx, torch.tensor([3, 3, 2, 1]), 5, 2,
                                                     0)
    with pytest.raises(RuntimeError, match="rowIdxType"):
        gkt.ops.moe_init_routing_grouped_matmul_grad(dy, w, idx, counts, 5, 2, 7)
    with pytest.raises(RuntimeError, match=r"expertIdx\[1, 0\] is 9"):
        gkt.ops.moe_init_routing(torch.randn(3, 4), torch.tensor([[0], [9], [1]]), 0, 4)
    with pytest.raises(RuntimeError, match=r"dy has dtype Char"):
        gkt.ops.elu_grad_v2(torch.zeros(3, dtype=torch.int8), torch.zeros(3, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="shape"):
        gkt.ops.elu_grad_v2(torch.zeros(3), torch.zeros(4))
    with pytest.raises(RuntimeError, match="gradOutput.*(double|float64)"):
        gkt.ops.elu_grad_v2(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="swapped|K"):
        gkt.ops.grouped_matmul(torch.randn(10, 6), w, counts)
    with pytest.raises(RuntimeError, match="threads is -1"):
        gkt.ops.set_num_threads(-1)


def test_version_and_isa(gkt):
    assert gkt.version().count(".") == 2
    assert gkt.ops.cpu_isa()


# Prepended to the probes below: THPeligible of the mapping holding the first 2 MiB boundary
# inside a tensor's data ("None" where smaps has no such field).
_THP_ELIGIBLE = """
def thp_eligible(t):
    huge = 1 << 21
    inside = (t.data_ptr() + huge - 1) // huge * huge
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            begin, end = (int(v, 16) for v in head.split("-"))
            if begin <= inside < end:
                return next((l.split()[1] for l in lines[i + 1:] if l.startswith("THPeligible:")), None)
    return None
"""


_THP_PROBE = _THP_ELIGIBLE + """
import torch, gradkit.torch as gkt
x = torch.randn(64, 1024)
dy = torch.randn(64, 2048)
dw = gkt.ops.grouped_matmul_weight_grad(x, dy, torch.tensor([64]), out_dtype=torch.float32)
print(thp_eligible(dw))
"""


def _thp_mode():
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")]


_THP_ALLOCATOR_PROBE = _THP_ELIGIBLE + """
import sys, torch, gradkit.torch as gkt
if sys.argv[1] == "call":
    assert gkt.use_huge_pages(True) is False
before = torch.ones(3 << 20)  # torch's own 12 MiB, made before any switch below
t = torch.empty(2 << 20)      # torch's own 8 MiB tensor, not a gradkit output
eligible = thp_eligible(t)
on = gkt.use_huge_pages(False)  # back to torch's allocator; blocks made under either free alike
assert gkt.use_huge_pages(False) is False
del t
assert float(before.sum()) == 3 << 20
print(eligible, on)
"""


@pytest.mark.parametrize("how", ["off", "call", "env"])
def test_huge_page_allocator_advises_torch_blocks(gkt, how):
    """gradkit.torch.use_huge_pages(True) (or THP_MEM_ALLOC_ENABLE=1 at import) advises torch's
    own large blocks for huge pages; off, torch's allocator is back, and switching frees
    tensors of either allocator alike."""
    mode = _thp_mode()
    if mode != "madvise":
        pytest.skip(f"transparent huge pages: {mode}: the advice cannot show")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    if how == "env":
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    result = subprocess.run([sys.executable, "-c", _THP_ALLOCATOR_PROBE, how], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    eligible, on = result.stdout.split()
    if eligible == "None":
        pytest.skip("this kernel's smaps has no THPeligible field")
    assert (eligible, on) == (("0", "False") if how == "off" else ("1", "True"))


@pytest.mark.parametrize("setting", [None, "0"])
def test_large_outputs_are_advised_for_huge_pages(gkt, setting):
    """An 8 MiB output's pages are eligible for transparent huge pages (madvise); with
    GRADKIT_TORCH_HUGEPAGES=0 they are not, where the kernel's mode is madvise."""
    mode = _thp_mode()
    if mode not in ("madvise", "always"):
        pytest.skip(f"transparent huge pages: {mode}")
    if setting == "0" and mode == "always":
        pytest.skip("THP always on: the setting cannot show")
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    env.pop("GRADKIT_TORCH_HUGEPAGES", None)
    if setting is not None:
        env["GRADKIT_TORCH_HUGEPAGES"] = setting
    result = subprocess.run([sys.executable, "-c", _THP_PROBE], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    eligible = result.stdout.strip()
    if eligible == "None":
        pytest.skip("this kernel's smaps has no THPeligible field")
    assert eligible == ("0" if setting == "0" else "1")
