"""gradkit.torch's autograd functions and MoeFFN against plain PyTorch: gradients of every input
and parameter, over routings, top-k, capacity drops, activations and dtypes; determinism."""
import pytest
import torch
import torch.nn.functional as F

import moe_reference as ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("alpha,scale,input_scale,save_result", [
    (1.0, 1.0, 1.0, False),
    (1.6732632423543772, 1.0507009873554805, 1.0, True),   # SELU, output saved
    (0.7, 1.0, 1 / 0.7, False),                            # CELU(0.7)
])
def test_elu_gradient_equals_torchs(gkt, dtype, alpha, scale, input_scale, save_result):
    x0 = torch.randn(41, 57).to(dtype)
    x = x0.clone().requires_grad_()
    y = gkt.elu(x, alpha, scale, input_scale, save_result)
    dy = torch.randn_like(y)
    y.backward(dy)
    x_ref = x0.clone().requires_grad_()
    y_ref = torch.ops.aten.elu(x_ref, alpha, scale, input_scale)
    y_ref.backward(dy)
    assert torch.equal(y, y_ref)
    eps = ref.EPS[dtype]
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=4 * eps, atol=4 * eps)


def test_elu_refuses_what_it_cannot_do(gkt):
    with pytest.raises(ValueError, match="save_result needs alpha >= 0"):
        gkt.elu(torch.randn(3), alpha=-1.0, save_result=True)
    with pytest.raises(TypeError, match="float64"):
        gkt.elu(torch.randn(3, dtype=torch.float64))


def per_expert_linear(x, expert_idx, weight, capacity):
    """y in expanded order, by plain torch ops (autograd through index_select and mm)."""
    row_slot, counts = ref.route(expert_idx, weight.shape[0], capacity)
    token = torch.div(row_slot, expert_idx.shape[1], rounding_mode="floor")
    rows = x.index_select(0, token)
    parts = [rows[s:s + c] @ weight[g] for g, (s, c) in
             enumerate(zip((torch.cumsum(counts, 0) - counts).tolist(), counts.tolist()))]
    return torch.cat(parts), row_slot


# Routings the expert-matmul tests run over: topK 1..8, skew, empty experts, capacity drops.
ROUTINGS = [
    (33, 1, 4, 0.0, (), 0),
    (40, 2, 8, 0.8, (), 0),
    (25, 3, 6, 0.0, (0, 5), 0),
    (20, 8, 8, 0.0, (), 0),
    (50, 2, 4, 0.3, (), 9),
]


@pytest.mark.parametrize("batch,topk,experts,skew,empty,capacity", ROUTINGS)
def test_grouped_linear_and_combine_gradients(gkt, batch, topk, experts, skew, empty, capacity):
    h, f = 24, 40
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch)
    x0 = torch.randn(batch, h)
    w0 = torch.randn(experts, h, f) / 4
    p0 = torch.rand(batch, topk)
    leaves = [t.clone().requires_grad_() for t in (x0, w0, p0)]
    x, w, p = leaves
    y, routing = gkt.moe_grouped_linear(x, expert_idx, w, capacity)
    out = gkt.moe_combine(gkt.moe_expert_linear(torch.tanh(y), routing, w.transpose(1, 2)), p,
                          routing)
    dout = torch.randn_like(out)
    out.backward(dout)

    rleaves = [t.clone().requires_grad_() for t in (x0, w0, p0)]
    rx, rw, rp = rleaves
    ry, row_slot = per_expert_linear(rx, expert_idx, rw, capacity)
    assert torch.equal(routing.expanded_row_idx, row_slot)
    counts = routing.group_list
    expert = ref.expert_of_rows(counts)
    y2 = torch.einsum("mf,mhf->mh", torch.tanh(ry), rw[expert])
    token = torch.div(row_slot, topk, rounding_mode="floor")
    rout = torch.zeros(batch, h).index_add(0, token, y2 * rp.reshape(-1)[row_slot].unsqueeze(1))
    rout.backward(dout)

    torch.testing.assert_close(y, ry, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, rout, rtol=1e-5, atol=1e-5)
    for got, want in zip(leaves, rleaves):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)


ACTIVATIONS = ["gelu", "relu", "silu", "elu"]


def make_pair(gkt, hidden, ffn, experts, topk, activation, capacity=0, dtype=torch.float32,
              seed=0):
    torch.manual_seed(seed)
    layer = gkt.MoeFFN(hidden, ffn, experts, topk, activation, capacity, dtype=dtype)
    peer = gkt.TorchMoeFFN(hidden, ffn, experts, topk, activation, capacity, dtype=dtype)
    peer.load_state_dict(layer.state_dict())
    return layer, peer


def step(module, x, dout):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    out = module(x)
    out.backward(dout)
    return out.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()}


def test_expert_chunks_cover_every_expert_and_row_once():
    from gradkit.torch.functional import expert_chunks
    counts = [3, 0, 7, 2, 0, 0, 9, 1]
    for budget in (1, 8, 40, 10 ** 9):
        chunks = expert_chunks(counts, 4, budget)
        assert [c[0] for c in chunks] == [0] + [c[1] for c in chunks[:-1]]
        assert [c[2] for c in chunks] == [0] + [c[3] for c in chunks[:-1]]
        assert chunks[-1][1] == len(counts) and chunks[-1][3] == sum(counts)
        for g0, g1, r0, r1 in chunks:
            assert r1 - r0 == sum(counts[g0:g1])
            # Within the budget, unless one expert alone exceeds it.
            assert (r1 - r0) * 4 <= budget or max(counts[g0:g1]) * 4 > budget or g1 - g0 == 1
    assert len(expert_chunks(counts, 4, 10 ** 9)) == 1
    assert len(expert_chunks(counts, 4, 1)) == 5  # each expert with rows starts a chunk


@pytest.mark.parametrize("activation", ACTIVATIONS + [torch.tanh])
@pytest.mark.parametrize("topk,capacity", [(1, 0), (2, 0), (4, 0), (2, 12)])
@pytest.mark.parametrize("chunk_bytes", [16 << 20, 1500])
def test_moe_ffn_gradients_equal_the_torch_modules(gkt, monkeypatch, activation, topk, capacity,
                                                   chunk_bytes):
    import gradkit.torch.functional
    monkeypatch.setattr(gradkit.torch.functional, "CHUNK_BYTES", chunk_bytes)  # 1500: a few experts each
    layer, peer = make_pair(gkt, 32, 48, 8, topk, activation, capacity, seed=topk)
    x = torch.randn(2, 30, 32)
    dout = torch.randn(2, 30, 32)
    out, dx, grads = step(layer, x, dout)
    rout, rdx, rgrads = step(peer, x, dout)
    torch.testing.assert_close(out, rout, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, rdx, rtol=1e-4, atol=1e-5)
    for name in ("router.weight", "w1", "w2"):
        torch.testing.assert_close(grads[name], rgrads[name], rtol=1e-4, atol=1e-5, msg=name)


def _square(t):  # an activation torch 1.13 has for float16 on CPU (gelu, relu, silu: not)
    return t * t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,topk,experts,skew,empty,capacity", ROUTINGS)
@pytest.mark.parametrize("chunk_bytes", [16 << 20, 1500])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_moe_ffn_experts_gradients_of_probs_h_and_w2(gkt, monkeypatch, dtype, batch, topk,
                                                     experts, skew, empty, capacity, chunk_bytes,
                                                     index_dtype):
    """MoeFFN's second matmul and combine are one node whose backward never sees y: the gradient
    of probs comes from (d_out @ W2^T) . act(h). Every input's gradient against TorchMoeFFN's
    experts() with the same routing, probs a leaf of its own (dropped slots get 0), in float32
    and (against a float32 run of the same 16-bit values) in bfloat16 and float16; int64 and
    int32 expert indices (the routing keeps int32)."""
    import gradkit.torch.functional
    monkeypatch.setattr(gradkit.torch.functional, "CHUNK_BYTES", chunk_bytes)
    activation = _square if dtype == torch.float16 else "gelu"
    layer, peer = make_pair(gkt, 24, 40, experts, topk, activation, capacity, seed=batch)
    layer, peer = layer.to(dtype), peer.to(torch.float32)
    peer.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    expert_idx = ref.make_expert_idx(batch, topk, experts, skew, empty, seed=batch)
    x0 = torch.randn(batch, 24).to(dtype)
    p0 = torch.rand(batch, topk).to(dtype)
    dout = torch.randn(batch, 24).to(dtype)
    got, want = [], []
    for module, results, dt in ((layer, got, dtype), (peer, want, torch.float32)):
        x, p = (t.detach().to(dt).clone().requires_grad_() for t in (x0, p0))
        module.zero_grad(set_to_none=True)
        out = module.experts(x, expert_idx.to(index_dtype), p)
        out.backward(dout.to(dt))
        results += [out, x.grad, p.grad, module.w1.grad, module.w2.grad]
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for name, a, b in zip(("out", "x", "probs", "w1", "w2"), got, want):
        scale = b.abs().max().item() + 1e-6
        assert (a.float() - b).abs().max().item() <= tol * scale, name
    if capacity > 0:  # a dropped slot gets no gradient
        row_slot, _ = ref.route(expert_idx, experts, capacity)
        dropped = torch.ones(batch * topk, dtype=torch.bool)
        dropped[row_slot] = False
        assert dropped.any() and torch.all(got[2].reshape(-1)[dropped] == 0)


@pytest.mark.parametrize("frozen", ["w2", "probs", "x and w1", "w2 and probs"])
def test_moe_ffn_experts_with_inputs_that_need_no_gradient(gkt, frozen):
    """The fused second node computes only the gradients asked for, and those equal the
    peer's: a frozen w2 (no d_W2), probs without a gradient (no u . act(h)), x and w1 frozen
    (d_h still flows to nothing but the first node is skipped)."""
    layer, peer = make_pair(gkt, 24, 40, 6, 2, "gelu", seed=3)
    expert_idx = ref.make_expert_idx(30, 2, 6, seed=3)
    x0, p0, dout = torch.randn(30, 24), torch.rand(30, 2), torch.randn(30, 24)
    results = []
    for module in (layer, peer):
        module.zero_grad(set_to_none=True)
        if "w2" in frozen:
            module.w2.requires_grad_(False)
        if "w1" in frozen:
            module.w1.requires_grad_(False)
        x = x0.clone().requires_grad_("x" not in frozen)
        p = p0.clone().requires_grad_("probs" not in frozen)
        module.experts(x, expert_idx, p).backward(dout)
        results.append([x.grad, p.grad, module.w1.grad, module.w2.grad])
    for name, a, b in zip(("x", "probs", "w1", "w2"), *results):
        if b is None:
            assert a is None, name
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_moe_ffn_keeps_neither_y_nor_act_h(gkt):
    """The node of the second matmul and the combine saves h [M, F], the parameters and the
    routing: no [M, H] tensor (y) and no second [M, F] one (act(h))."""
    batch, topk, hidden, ffn = 30, 2, 16, 24
    layer, _ = make_pair(gkt, hidden, ffn, 4, topk, "gelu")
    out = layer(torch.randn(batch, hidden, requires_grad=True))
    nodes, seen, saved = [out.grad_fn], set(), []
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "ExpertsDownCombine" in type(node).__name__:
            saved = [tuple(t.shape) for t in node.saved_tensors]
        nodes += [n for n, _ in node.next_functions]
    m = batch * topk
    assert (m, ffn) in saved, saved
    assert (m, hidden) not in saved and saved.count((m, ffn)) == 1, saved


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_bytes", [16 << 20, 1500])
def test_grad_accumulation_fusion_gives_autograds_gradients(gkt, monkeypatch, dtype, chunk_bytes):
    """MoeFFN(grad_accumulation_fusion=True) adds d_W1, d_W2 into w1.grad, w2.grad itself: made
    when None (the same bits as autograd's), added into over micro-batches (float32: the same
    bits as autograd's accumulation; bfloat16: one rounding instead of two)."""
    import gradkit.torch.functional
    monkeypatch.setattr(gradkit.torch.functional, "CHUNK_BYTES", chunk_bytes)
    layer, _ = make_pair(gkt, 32, 48, 6, 2, "gelu", dtype=dtype, seed=4)
    fused = gkt.MoeFFN(32, 48, 6, 2, "gelu", dtype=dtype, grad_accumulation_fusion=True)
    fused.load_state_dict(layer.state_dict())
    xs = [torch.randn(40, 32).to(dtype) for _ in range(3)]
    douts = [torch.randn(40, 32).to(dtype) for _ in range(3)]
    out, dx, grads = step(layer, xs[0], douts[0])
    fout, fdx, fgrads = step(fused, xs[0], douts[0])
    assert torch.equal(out, fout) and torch.equal(dx, fdx)
    for name in grads:
        assert torch.equal(grads[name], fgrads[name]), name
    # Micro-batches accumulated into existing gradients.
    for module in (layer, fused):
        module.zero_grad(set_to_none=False)
        for x, dout in zip(xs, douts):
            module(x).backward(dout)
    for name, p in layer.named_parameters():
        q = dict(fused.named_parameters())[name]
        if dtype == torch.float32 or name == "router.weight":
            assert torch.equal(p.grad, q.grad), name
        else:
            scale = p.grad.float().abs().max()
            assert (p.grad.float() - q.grad.float()).abs().max() <= 2 ** -7 * scale, name
    # The weights' gradients never reach autograd: torch.autograd.grad sees none for them.
    x = xs[0].clone().requires_grad_()
    w1_grad = fused.w1.grad.clone()
    (gx,) = torch.autograd.grad(fused(x).sum(), x)
    assert torch.equal(gx, torch.autograd.grad(layer(x).sum(), x)[0])
    assert not torch.equal(fused.w1.grad, w1_grad)  # added into, as documented


def test_grad_accumulation_fusion_falls_back_for_a_non_leaf_weight(gkt):
    """A weight that is not a leaf (here a product) gets its gradient through autograd."""
    routing_x = torch.randn(30, 16)
    expert_idx = torch.randint(0, 4, (30, 2))
    w = torch.randn(4, 16, 8, requires_grad=True)
    for fuse in (False, True):
        w.grad = None
        y, _ = gkt.moe_grouped_linear(routing_x, expert_idx, w * 2,
                                      grad_accumulation_fusion=fuse)
        y.sum().backward()
        if not fuse:
            want = w.grad.clone()
    assert torch.equal(w.grad, want)


def test_moe_ffn_bfloat16_tracks_float32(gkt):
    layer, peer = make_pair(gkt, 32, 64, 4, 2, "gelu", seed=5)
    x = torch.randn(64, 32)
    dout = torch.randn(64, 32)
    _, dx32, g32 = step(peer, x, dout)
    layer16 = layer.to(torch.bfloat16)
    _, dx16, g16 = step(layer16, x.bfloat16(), dout.bfloat16())
    # bfloat16 keeps 8 bits: a few of its ulps of each gradient's scale.
    for got, want in [(dx16, dx32), (g16["w1"], g32["w1"]), (g16["w2"], g32["w2"])]:
        scale = want.abs().max()
        assert (got.float() - want).abs().max() <= 0.05 * scale


def test_moe_ffn_is_deterministic(gkt):
    layer, _ = make_pair(gkt, 48, 64, 8, 2, "gelu", seed=9)
    x = torch.randn(200, 48)
    dout = torch.randn(200, 48)
    first = step(layer, x, dout)
    for threads in (1, 3, 0):
        gkt.ops.set_num_threads(threads)
        again = step(layer, x, dout)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
        for name in first[2]:
            assert torch.equal(again[2][name], first[2][name])


def test_moe_ffn_refuses_bad_configurations(gkt):
    with pytest.raises(ValueError, match="topk is 5"):
        gkt.MoeFFN(8, 8, 4, 5)
    with pytest.raises(ValueError, match="capacity is -1"):
        gkt.MoeFFN(8, 8, 4, 2, capacity=-1)
    with pytest.raises(ValueError, match="activation is 'tanhh'"):
        gkt.MoeFFN(8, 8, 4, 2, activation="tanhh")
    layer = gkt.MoeFFN(8, 8, 4, 2)
    with pytest.raises(RuntimeError, match="shape"):
        layer(torch.randn(3, 7))


def test_moe_ffn_trains(gkt):
    """A few SGD steps on a fixed regression target lower the loss as they do for the peer."""
    layer, peer = make_pair(gkt, 16, 32, 4, 2, "silu", seed=2)
    x = torch.randn(128, 16)
    target = torch.sin(x)
    losses = {}
    for name, module in (("gradkit", layer), ("torch", peer)):
        opt = torch.optim.SGD(module.parameters(), lr=0.5)
        curve = []
        for _ in range(80):
            opt.zero_grad()
            loss = F.mse_loss(module(x), target)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[name] = curve
    assert losses["gradkit"][-1] < 0.6 * losses["gradkit"][0]
    for a, b in zip(losses["gradkit"], losses["torch"]):
        assert abs(a - b) <= 1e-3 * max(abs(b), 1e-6) + 1e-5


def module_grad(module, x, dout):
    x = x.clone().requires_grad_()
    module(x if not getattr(module, "inplace", False) else x * 1).backward(dout)
    return x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_aten_elu_backward_switch(gkt, dtype):
    modules = [torch.nn.ELU(), torch.nn.SELU(), torch.nn.CELU(0.7), torch.nn.ELU(inplace=True)]
    x = (torch.randn(50, 30) * 3).to(dtype)
    dout = torch.randn(50, 30).to(dtype)
    for module in modules:
        want = module_grad(module, x, dout)
        before = gkt.aten_elu_backward_calls()
        with gkt.aten_elu_backward_on_gradkit():
            got = module_grad(module, x, dout)
        # float64 is not a gradkit dtype: the switch computes it with torch's formula instead.
        assert gkt.aten_elu_backward_calls() == before + (dtype != torch.float64), module
        eps = ref.EPS.get(dtype, 2.0 ** -52)
        torch.testing.assert_close(got, want, rtol=4 * eps, atol=4 * eps)
        # The block's end gives torch's own kernel back.
        module_grad(module, x, dout)
        assert gkt.aten_elu_backward_calls() == before + (dtype != torch.float64)


def test_moe_ffn_refuses_a_second_backward_through_the_same_graph(gkt):
    layer, _ = make_pair(gkt, 16, 24, 4, 2, "gelu")
    out = layer(torch.randn(20, 16))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
