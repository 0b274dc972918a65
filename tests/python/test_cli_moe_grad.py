"""`gradkit moe-grad` against a composite built from PyTorch in float64: per-expert mm, then
index_add_ into gradX (the unfused MoE backward), from the same dtype-rounded inputs."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch

CLI = os.environ.get("GRADKIT_CLI", "build/release/bin/gradkit")
TOLERANCE = 1e-5  # x sum of |dy * w| over each element's terms (moe_grad_ref.h)


def routing(batch, top_k, experts, keep, rng):
    """Slots routed to experts (-1: dropped); rows sorted by (expert, slot) as MoeInitRouting."""
    expert = rng.integers(0, experts, size=batch * top_k)
    expert[rng.random(batch * top_k) >= keep] = -1
    slots = np.flatnonzero(expert >= 0)
    order = slots[np.lexsort((slots, expert[slots]))]  # gather: row -> slot
    counts = np.bincount(expert[slots], minlength=experts).astype(np.int64)
    scatter = np.full(batch * top_k, -1, dtype=np.int64)
    scatter[order] = np.arange(len(order))
    return order.astype(np.int64), scatter, counts


def torch_composite(dy, w, gather, counts, batch, top_k):
    """gradX in float64: per-expert mm into d_expanded_x, then index_add_ by token."""
    dy, w = torch.as_tensor(dy, dtype=torch.float64), torch.as_tensor(w, dtype=torch.float64)
    expanded = torch.empty(dy.shape[0], w.shape[1], dtype=torch.float64)
    magnitude = torch.empty_like(expanded)
    row = 0
    for e, rows in enumerate(counts.tolist()):
        expanded[row:row + rows] = dy[row:row + rows].mm(w[e].t())
        magnitude[row:row + rows] = dy[row:row + rows].abs().mm(w[e].abs().t())
        row += rows
    tokens = torch.as_tensor(gather // top_k)
    dx = torch.zeros(batch, w.shape[1], dtype=torch.float64).index_add_(0, tokens, expanded)
    mag = torch.zeros_like(dx).index_add_(0, tokens, magnitude)
    return dx.numpy(), mag.numpy()


def rounded(values, dtype):
    """The values the operator computes with: float32 input rounded to the dtype (RNE)."""
    t = torch.from_numpy(values.astype(np.float32))
    return {"f32": t, "f16": t.half(), "bf16": t.bfloat16()}[dtype].double().numpy()


def run_cli(tmp_path, args):
    return subprocess.run([CLI, *args], capture_output=True, text=True, cwd=tmp_path)


def write_case(tmp_path, batch, top_k, experts, k, n, keep, seed, integers=False, file_dtype=np.float32):
    rng = np.random.default_rng(seed)
    gather, scatter, counts = routing(batch, top_k, experts, keep, rng)
    m = len(gather)
    if integers:
        dy = rng.integers(-3, 4, size=(m, n)).astype(np.float32)
        w = rng.integers(-3, 4, size=(experts, k, n)).astype(np.float32)
    else:
        dy = rng.uniform(-1, 1, size=(m, n)).astype(np.float32)
        w = rng.uniform(-1, 1, size=(experts, k, n)).astype(np.float32)
    np.save(tmp_path / "dy.npy", dy.astype(file_dtype))
    np.save(tmp_path / "w.npy", w.astype(file_dtype))
    np.save(tmp_path / "gather.npy", gather)
    np.save(tmp_path / "gather32.npy", gather.astype(np.int32))
    np.save(tmp_path / "scatter.npy", scatter)
    np.save(tmp_path / "counts.npy", counts)
    np.save(tmp_path / "cumsum.npy", np.cumsum(counts))
    return dy.astype(file_dtype).astype(np.float32), w.astype(file_dtype).astype(np.float32), gather, counts


BASE = ["moe-grad", "--grad-y", "dy.npy", "--weight", "w.npy", "--out", "dx.npy"]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("row_idx_type,index_file,group_list_type,group_file", [
    (0, "gather.npy", "count", "counts.npy"),
    (0, "gather32.npy", "cumsum", "cumsum.npy"),
    (1, "scatter.npy", "count", "counts.npy"),
    (1, "scatter.npy", "cumsum", "cumsum.npy"),
])
def test_matches_torch_composite(tmp_path, dtype, row_idx_type, index_file, group_list_type, group_file):
    batch, top_k, experts, k, n = 97, 3, 7, 300, 130  # no tile divides K or N
    file_dtype = np.float16 if dtype == "f16" else np.float32
    dy, w, gather, counts = write_case(tmp_path, batch, top_k, experts, k, n, 0.85, 3, file_dtype=file_dtype)
    r = run_cli(tmp_path, [*BASE, "--expanded-row-idx", index_file, "--group-list", group_file,
                           "--batch", str(batch), "--topk", str(top_k), "--row-idx-type",
                           str(row_idx_type), "--group-list-type", group_list_type, "--dtype", dtype])
    assert r.returncode == 0, r.stderr
    dx = np.load(tmp_path / "dx.npy")
    assert dx.dtype == np.float32 and dx.shape == (batch, k)
    ref, mag = torch_composite(rounded(dy, dtype), rounded(w, dtype), gather, counts, batch, top_k)
    assert np.all(np.abs(dx - ref) <= TOLERANCE * mag), np.max(np.abs(dx - ref) / np.maximum(mag, 1e-30))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_small_integers_are_exact(tmp_path, dtype):
    batch, top_k, experts, k, n = 64, 4, 5, 130, 70
    dy, w, gather, counts = write_case(tmp_path, batch, top_k, experts, k, n, 0.9, 4, integers=True)
    r = run_cli(tmp_path, [*BASE, "--expanded-row-idx", "gather.npy", "--group-list", "counts.npy",
                           "--batch", str(batch), "--topk", str(top_k), "--dtype", dtype, "--threads", "3"])
    assert r.returncode == 0, r.stderr
    ref, _ = torch_composite(dy, w, gather, counts, batch, top_k)
    np.testing.assert_array_equal(np.load(tmp_path / "dx.npy"), ref)


def test_thread_counts_give_identical_bytes(tmp_path):
    write_case(tmp_path, 300, 4, 6, 520, 96, 0.9, 5)
    outputs = []
    for threads in (1, 2, 3, 4):
        r = run_cli(tmp_path, ["moe-grad", "--grad-y", "dy.npy", "--weight", "w.npy", "--expanded-row-idx",
                               "gather.npy", "--group-list", "counts.npy", "--batch", "300",
                               "--topk", "4", "--dtype", "bf16", "--threads", str(threads),
                               "--out", f"dx{threads}.npy"])
        assert r.returncode == 0, r.stderr
        outputs.append((tmp_path / f"dx{threads}.npy").read_bytes())
    assert all(o == outputs[0] for o in outputs)


@pytest.mark.parametrize("change,expected", [
    (["--batch", "0"], "batch is 0"),
    (["--topk", "1"], "more than --batch 40 * --topk 1"),
    (["--row-idx-type", "2"], "--row-idx-type is 2"),
    (["--row-idx-type", "1"], "--expanded-row-idx has"),
    (["--group-list-type", "prefix"], "--group-list-type is 'prefix'"),
    (["--dtype", "f64"], "--dtype is 'f64'"),
    (["--group-list", "bad_counts.npy"], "rows of --grad-y"),
    (["--expanded-row-idx", "bad_gather.npy"], "--expanded-row-idx[3] is 999"),
    (["--expanded-row-idx", "float_idx.npy"], "--expanded-row-idx holds <f4"),
    (["--weight", "missing.npy"], "missing.npy"),
])
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, change, expected):
    _, _, gather, counts = write_case(tmp_path, 40, 2, 3, 16, 8, 0.9, 6)
    np.save(tmp_path / "bad_counts.npy", counts + 1)
    bad = gather.copy()
    bad[3] = 999
    np.save(tmp_path / "bad_gather.npy", bad)
    np.save(tmp_path / "float_idx.npy", gather.astype(np.float32))
    args = {"--grad-y": "dy.npy", "--weight": "w.npy", "--expanded-row-idx": "gather.npy",
            "--group-list": "counts.npy", "--batch": "40", "--topk": "2", "--out": "dx.npy"}
    args.update(dict(zip(change[::2], change[1::2])))
    r = run_cli(tmp_path, ["moe-grad", *[x for kv in args.items() for x in kv]])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradkit: error:"), r.stderr
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "dx.npy").exists()


def test_plan_is_json(tmp_path):
    r = run_cli(tmp_path, ["plan", "moe-grad", "--preset", "S3", "--dtype", "bf16", "--threads", "2"])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["parall_num"] >= 2 and plan["threads"] == 2
    assert plan["workspace_bytes"] <= 16 << 20 < plan["unfused_bytes"]
    for region in plan["workspace"].values():
        if isinstance(region, dict):
            assert region["offset"] % 512 == 0
    bad = run_cli(tmp_path, ["plan", "moe-grad", "--preset", "S9"])
    assert bad.returncode == 2 and bad.stderr.startswith("gradkit: error: --preset is 'S9'")
    # --shape means dimensions (plan elu-grad); here it points to what takes a MoE shape.
    bad = run_cli(tmp_path, ["plan", "moe-grad", "--shape", "S3"])
    assert bad.returncode == 2 and "--preset S1..S4 or --batch --topk" in bad.stderr


def test_bench_json_keys(tmp_path):
    r = run_cli(tmp_path, ["bench", "moe-grad", "--preset", "S1", "--dtype", "bf16", "--threads", "2",
                           "--json", "--min-time", "0.01"])
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("op", "shape", "dtype", "threads", "gflops", "dense_gflops", "unfused_gflops",
                "torch_gflops", "workspace_bytes", "unfused_bytes"):
        assert key in row
    assert row["shape"] == "S1" and row["threads"] == 2 and row["gflops"] > 0
    assert row["workspace_bytes"] < row["unfused_bytes"]
    # "gemm" names the dense ceiling's library; "tile_gemm" the GEMM the op's plan runs tiles on.
    plan = json.loads(run_cli(tmp_path, ["plan", "moe-grad", "--preset", "S1", "--dtype", "bf16"]).stdout)
    base_impl = plan["gemm_impl"][str(plan["base_n"])]
    tile_gemm = f'{plan["gemm_backend"]}: {base_impl}'
    if plan["broadcast_max_rows"] > 0:
        tile_gemm += f'; experts of at most {plan["broadcast_max_rows"]} rows in the weights-broadcast form'
    assert row["tile_gemm"] == tile_gemm, (row["tile_gemm"], plan)
