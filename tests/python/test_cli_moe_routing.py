"""`gradkit moe-init-routing`, `moe-finalize-routing` and `moe-finalize-routing-grad` against
composites built from NumPy (a stable argsort for the routing) and PyTorch in float64 (the
weighted sum and its autograd), from the same dtype-rounded inputs."""
import os
import subprocess

import numpy as np
import pytest
import torch

CLI = os.environ.get("GRADKIT_CLI", "build/release/bin/gradkit")
TOLERANCE = 1e-5  # x the sum of |terms| of each element (moe_finalize_routing_ref.h)
ROUNDING = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}  # one rounding to the output dtype


def run_cli(tmp_path, *args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=tmp_path)


def numpy_routing(expert_idx, experts, capacity):
    """Rows by (expert, slot) from a stable argsort; each expert keeps its first `capacity`."""
    flat = expert_idx.reshape(-1)
    order = np.argsort(flat, kind="stable")
    rank = np.empty_like(order)
    for e in range(experts):
        mine = order[flat[order] == e]
        rank[mine] = np.arange(len(mine))
    kept = order[(capacity == 0) | (rank[order] < capacity)]  # gather: row -> slot
    scatter = np.full(flat.size, -1, dtype=np.int64)
    scatter[kept] = np.arange(len(kept))
    counts = np.bincount(flat[kept], minlength=experts).astype(np.int64)
    return kept.astype(np.int64), scatter, counts


def rounded(values, dtype):
    t = torch.from_numpy(values.astype(np.float32))
    return {"f32": t, "f16": t.half(), "bf16": t.bfloat16()}[dtype].double().numpy()


@pytest.mark.parametrize("capacity", [0, 1, 5])
@pytest.mark.parametrize("row_idx_type,group_list_type", [(0, "count"), (1, "cumsum"), (0, "cumsum")])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_init_routing_matches_numpy(tmp_path, capacity, row_idx_type, group_list_type, dtype):
    rng = np.random.default_rng(capacity * 7 + row_idx_type)
    batch, top_k, experts, h = 40, 3, 6, 10
    x = rng.standard_normal((batch, h)).astype(np.float32)
    expert_idx = rng.integers(0, experts, size=(batch, top_k))
    expert_idx[rng.random((batch, top_k)) < 0.4] = 2  # skewed: expert 2 over capacity
    expert_idx[expert_idx == 4] = 5  # expert 4 empty
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "e.npy", expert_idx.astype(np.int32))
    r = run_cli(tmp_path, "moe-init-routing", "--x", "x.npy", "--expert-idx", "e.npy",
                "--num-experts", experts, "--capacity", capacity, "--row-idx-type", row_idx_type,
                "--group-list-type", group_list_type, "--dtype", dtype, "--out-x", "ex.npy",
                "--out-row-idx", "r.npy", "--out-group-list", "g.npy")
    assert r.returncode == 0, r.stderr
    gather, scatter, counts = numpy_routing(expert_idx, experts, capacity)
    groups = np.load(tmp_path / "g.npy")
    assert groups.dtype == np.int64
    np.testing.assert_array_equal(groups, counts if group_list_type == "count" else np.cumsum(counts))
    idx = np.load(tmp_path / "r.npy")
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, gather if row_idx_type == 0 else scatter)
    expanded = np.load(tmp_path / "ex.npy").astype(np.float64)
    np.testing.assert_array_equal(expanded, rounded(x, dtype)[gather // top_k])
    if capacity == 1:
        assert counts[4] == 0 and counts.max() == 1


def finalize_case(tmp_path, dtype, row_idx_type, capacity, seed):
    rng = np.random.default_rng(seed)
    batch, top_k, experts, n = 33, 4, 5, 24
    expert_idx = rng.integers(0, experts, size=(batch, top_k))
    gather, scatter, _ = numpy_routing(expert_idx, experts, capacity)
    m = len(gather)
    y = rng.standard_normal((m, n)).astype(np.float32)
    probs = rng.random((batch, top_k)).astype(np.float32)
    grad_out = rng.standard_normal((batch, n)).astype(np.float32)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "p.npy", probs)
    np.save(tmp_path / "go.npy", grad_out)
    np.save(tmp_path / "r.npy", gather if row_idx_type == 0 else scatter)
    return dict(batch=batch, top_k=top_k, n=n, m=m, gather=gather, scatter=scatter,
                y=rounded(y, dtype), probs=probs.astype(np.float64),
                grad_out=rounded(grad_out, dtype))


def torch_finalize(c):
    """out = sum_j probs[b, j] * y[row(b, j)] in float64, and its autograd gradients."""
    y = torch.tensor(c["y"], requires_grad=True)
    probs = torch.tensor(c["probs"], requires_grad=True)
    rows = torch.as_tensor(c["scatter"]).view(c["batch"], c["top_k"])
    kept = (rows >= 0).double()
    gathered = y[rows.clamp(min=0)] * kept.unsqueeze(-1)  # [batch, topK, N], dropped -> 0
    out = (probs.unsqueeze(-1) * gathered).sum(1)
    out.backward(torch.tensor(c["grad_out"]))
    magnitude = (probs.abs().unsqueeze(-1) * gathered.abs()).sum(1)
    return out.detach().numpy(), magnitude.detach().numpy(), y.grad.numpy(), probs.grad.numpy()


def assert_within(got, want, magnitude, dtype):
    bound = TOLERANCE * magnitude + ROUNDING[dtype] * np.abs(want) + (2.0**-25 if dtype == "f16" else 0)
    bad = np.abs(got - want) > bound
    assert not bad.any(), f"{bad.sum()} elements off; first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("capacity", [0, 3])
@pytest.mark.parametrize("row_idx_type", [0, 1])
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_finalize_matches_torch(tmp_path, dtype, row_idx_type, capacity):
    c = finalize_case(tmp_path, dtype, row_idx_type, capacity, seed=11 + capacity)
    r = run_cli(tmp_path, "moe-finalize-routing", "--expanded-y", "y.npy", "--probs", "p.npy",
                "--expanded-row-idx", "r.npy", "--row-idx-type", row_idx_type, "--dtype", dtype,
                "--out", "out.npy", "-q")
    assert r.returncode == 0, r.stderr
    want, magnitude, _, _ = torch_finalize(c)
    got = np.load(tmp_path / "out.npy").astype(np.float64)
    assert got.shape == (c["batch"], c["n"])
    assert_within(got, want, magnitude, dtype)


@pytest.mark.parametrize("row_idx_type", [0, 1])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_finalize_grad_matches_torch_autograd(tmp_path, dtype, row_idx_type):
    c = finalize_case(tmp_path, dtype, row_idx_type, capacity=3, seed=21)
    r = run_cli(tmp_path, "moe-finalize-routing-grad", "--grad-out", "go.npy", "--expanded-y",
                "y.npy", "--probs", "p.npy", "--expanded-row-idx", "r.npy", "--row-idx-type",
                row_idx_type, "--dtype", dtype, "--out-grad-y", "gy.npy", "--out-grad-probs",
                "gp.npy")
    assert r.returncode == 0, r.stderr
    _, _, want_gy, want_gp = torch_finalize(c)
    grad_y = np.load(tmp_path / "gy.npy").astype(np.float64)
    grad_probs = np.load(tmp_path / "gp.npy").astype(np.float64)
    rows = c["scatter"].reshape(c["batch"], c["top_k"])
    # magnitudes: |probs| |gradOut| per row, sum |gradOut . y| terms per slot
    tokens = c["gather"] // c["top_k"]
    mag_gy = np.abs(c["probs"].reshape(-1)[c["gather"]])[:, None] * np.abs(c["grad_out"][tokens])
    mag_gp = np.where(rows >= 0, (np.abs(c["grad_out"])[:, None, :] * np.abs(c["y"][rows.clip(0)])).sum(-1), 0)
    assert_within(grad_y, want_gy, mag_gy, dtype)
    assert_within(grad_probs, want_gp, mag_gp, "f32")
    assert (grad_probs[rows < 0] == 0).all()


def test_errors_name_the_option(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2], [3, 0], [1, 1]], np.int64))
    base = ["moe-init-routing", "--x", "x.npy", "--expert-idx", "e.npy", "--out-x", "a.npy",
            "--out-row-idx", "b.npy", "--out-group-list", "c.npy"]
    r = run_cli(tmp_path, *base, "--num-experts", 3)
    assert r.returncode == 2
    assert "--expert-idx[2, 0] is 3, it must be an expert in [0, 3) (--num-experts)" in r.stderr
    assert not (tmp_path / "a.npy").exists()
    r = run_cli(tmp_path, *base, "--num-experts", 4, "--capacity", -1)
    assert r.returncode == 2 and "--capacity is -1" in r.stderr
    r = run_cli(tmp_path, *base, "--num-experts", 4, "--group-list-type", "sum")
    assert r.returncode == 2 and "--group-list-type is 'sum'" in r.stderr

    np.save(tmp_path / "y.npy", np.zeros((4, 5), np.float32))
    np.save(tmp_path / "p.npy", np.zeros((2, 2), np.float32))
    np.save(tmp_path / "r.npy", np.array([0, 1, 2, 2], np.int64))
    fin = ["moe-finalize-routing", "--expanded-y", "y.npy", "--probs", "p.npy",
           "--expanded-row-idx", "r.npy", "--out", "o.npy"]
    r = run_cli(tmp_path, *fin, "--row-idx-type", 0)
    assert r.returncode == 2
    assert "--expanded-row-idx[3] is 2, a slot already named by an earlier row" in r.stderr
    r = run_cli(tmp_path, *fin, "--row-idx-type", 2)
    assert r.returncode == 2 and "--row-idx-type is 2" in r.stderr
    np.save(tmp_path / "p.npy", np.zeros((3, 2), np.float32))
    np.save(tmp_path / "go.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "r.npy", np.array([0, 1, 2, 3], np.int64))
    r = run_cli(tmp_path, "moe-finalize-routing-grad", "--grad-out", "go.npy", "--expanded-y",
                "y.npy", "--probs", "p.npy", "--expanded-row-idx", "r.npy", "--row-idx-type", 0,
                "--out-grad-y", "gy.npy", "--out-grad-probs", "gp.npy")
    assert r.returncode == 2
    assert "--grad-out has shape [3, 4]: dim 1 is 4, it must be 5" in r.stderr
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "gy.npy").exists()


def test_layer_chain_routes_and_finalizes(tmp_path):
    """init routing -> identity experts -> finalize: out[b] = (sum of kept probs) * x[b]."""
    rng = np.random.default_rng(5)
    batch, top_k, experts, h = 25, 2, 4, 6
    x = rng.integers(-3, 4, size=(batch, h)).astype(np.float32)
    expert_idx = rng.integers(0, experts, size=(batch, top_k))
    probs = (rng.integers(0, 5, size=(batch, top_k)) / 4).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "e.npy", expert_idx)
    np.save(tmp_path / "p.npy", probs)
    r = run_cli(tmp_path, "moe-init-routing", "--x", "x.npy", "--expert-idx", "e.npy",
                "--num-experts", experts, "--capacity", 8, "--row-idx-type", 1, "--out-x",
                "ex.npy", "--out-row-idx", "r.npy", "--out-group-list", "g.npy")
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, "moe-finalize-routing", "--expanded-y", "ex.npy", "--probs", "p.npy",
                "--expanded-row-idx", "r.npy", "--row-idx-type", 1, "--out", "out.npy")
    assert r.returncode == 0, r.stderr
    kept = np.load(tmp_path / "r.npy").reshape(batch, top_k) >= 0
    want = (probs * kept).sum(1, keepdims=True) * x
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


def test_bench_reports_each_operator_beside_its_copy(cli):
    import json
    r = cli("bench", "moe-routing", "--preset", "S1", "--dtype", "bf16", "--threads", "1",
            "--min-time", "0.01", "--json")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["op"] for row in rows] == ["init", "finalize", "finalize_grad"]
    for row in rows:
        assert row["shape"] == "S1" and row["dtype"] == "bfloat16" and row["M"] == 8192
        assert row["gbps"] > 0 and row["copy_gbps"] > 0
        assert abs(row["vs_copy"] - row["gbps"] / row["copy_gbps"]) < 1e-3
    bad = cli("bench", "moe-routing", "--preset", "S9", check=False)
    assert bad.returncode == 2 and "--preset is 'S9', it must be S1..S4" in bad.stderr
