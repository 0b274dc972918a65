"""The CLI's EluGradV2 against Debian's PyTorch (torch.ops.aten.elu_backward)."""
import json

import numpy as np
import pytest
import torch

from elu_reference import CASES, float64_formula, tolerance, torch_reference


def save(path, array):
    np.save(path, array)
    return path


# ulp: relative spacing of the dtype; subnormal_ulp: its absolute spacing below the normal range.
@pytest.mark.parametrize("dtype_name,torch_dtype,ulp,subnormal_ulp", [
    ("f32", torch.float32, 2.0 ** -23, 2.0 ** -149),
    ("f16", torch.float16, 2.0 ** -10, 2.0 ** -24),
    ("bf16", torch.bfloat16, 2.0 ** -7, 2.0 ** -133),
])
@pytest.mark.parametrize("alpha,scale,input_scale,is_result", CASES)
def test_matches_torch(cli, tmp_path, dtype_name, torch_dtype, ulp, subnormal_ulp, alpha, scale,
                       input_scale, is_result):
    rng = np.random.default_rng(1234)
    shape = (37, 129)
    dy = rng.uniform(-3, 3, shape).astype(np.float32)
    x = rng.uniform(-6, 4, shape).astype(np.float32)
    if is_result:
        x = np.maximum(x, -alpha * scale + 1e-3).astype(np.float32)
    out = tmp_path / "y.npy"
    args = ["elu-grad", "--dy", save(tmp_path / "dy.npy", dy), "--x", save(tmp_path / "x.npy", x),
            "--out", out, "--alpha", repr(alpha), "--scale", repr(scale),
            "--input-scale", repr(input_scale), "--dtype", dtype_name]
    if is_result:
        args.append("--is-result")
    cli(*args)
    got = np.load(out).astype(np.float64)
    assert got.shape == shape
    expected_torch, dy64, x64 = torch_reference(dy, x, alpha, scale, input_scale, is_result,
                                                torch_dtype)
    exact = float64_formula(dy64, x64, alpha, scale, input_scale, is_result)
    bound = tolerance(exact, x64, input_scale, ulp, subnormal_ulp)
    assert np.all(np.abs(got - expected_torch) <= bound)
    assert np.all(np.abs(got - exact) <= bound)


def test_float16_output_file_holds_halves(cli, tmp_path):
    dy = np.linspace(-2, 2, 100, dtype=np.float16)
    x = np.linspace(-3, 3, 100, dtype=np.float16)
    out = tmp_path / "y.npy"
    cli("elu-grad", "--dy", save(tmp_path / "dy.npy", dy), "--x", save(tmp_path / "x.npy", x),
        "--out", out)
    y = np.load(out)
    assert y.dtype == np.float16
    expected, _, _ = torch_reference(dy.astype(np.float32), x.astype(np.float32), 1.0, 1.0, 1.0,
                                     False, torch.float16)
    np.testing.assert_allclose(y.astype(np.float32), expected, rtol=2 ** -9, atol=1e-7)


def test_out_dtype_f32_for_bf16_inputs(cli, tmp_path):
    dy = np.ones(64, np.float32)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    out = tmp_path / "y.npy"
    cli("elu-grad", "--dy", save(tmp_path / "dy.npy", dy), "--x", save(tmp_path / "x.npy", x),
        "--out", out, "--dtype", "bf16", "--out-dtype", "f32")
    y = np.load(out)
    assert y.dtype == np.float32
    x_bf16 = torch.from_numpy(x).bfloat16().double().numpy()
    exact = float64_formula(np.ones(64), x_bf16, 1.0, 1.0, 1.0, False)
    np.testing.assert_allclose(y, exact, rtol=4 * 2 ** -23)


def test_nan_in_x_gives_nan(cli, tmp_path):
    x = np.array([np.nan, -1.0, np.nan, 2.0] * 5, np.float32)
    dy = np.ones_like(x)
    out = tmp_path / "y.npy"
    cli("elu-grad", "--dy", save(tmp_path / "dy.npy", dy), "--x", save(tmp_path / "x.npy", x),
        "--out", out)
    y = np.load(out)
    assert np.array_equal(np.isnan(y), np.isnan(x))


@pytest.mark.parametrize("problem,needle", [
    ("shape", "--x has shape [5] but --dy has shape [4]"),
    ("missing", "cannot open"),
    ("alpha", "--alpha is -1 with --is-result"),
    ("out_dtype", "--out-dtype is f16, but the inputs are computed as f32"),
    ("threads", "--threads is 5000"),
    ("dtype", "--dtype is 'f64'"),
    ("intfile", "a float array"),
    ("garbage", "not a .npy file"),
])
def test_bad_input_exits_2_without_output(cli, tmp_path, problem, needle):
    dy = save(tmp_path / "dy.npy", np.ones(4, np.float32))
    x = save(tmp_path / "x.npy", np.ones(4, np.float32))
    out = tmp_path / "y.npy"
    args = ["elu-grad", "--dy", dy, "--x", x, "--out", out]
    if problem == "shape":
        args[4] = save(tmp_path / "x5.npy", np.ones(5, np.float32))
    elif problem == "missing":
        args[2] = tmp_path / "absent.npy"
    elif problem == "alpha":
        args += ["--alpha", "-1", "--is-result"]
    elif problem == "dtype":
        args += ["--dtype", "f64"]
    elif problem == "out_dtype":
        args += ["--out-dtype", "f16"]
    elif problem == "threads":
        args += ["--threads", "5000"]
    elif problem == "intfile":
        args[2] = save(tmp_path / "int.npy", np.ones(4, np.int32))
    elif problem == "garbage":
        (tmp_path / "garbage.npy").write_bytes(b"hello world, not numpy")
        args[2] = tmp_path / "garbage.npy"
    result = cli(*args, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradkit: error:"), result.stderr
    assert needle in lines[0]
    assert not out.exists()


def test_existing_output_is_not_touched_on_error(cli, tmp_path):
    out = tmp_path / "y.npy"
    out.write_bytes(b"previous contents")
    result = cli("elu-grad", "--dy", tmp_path / "absent.npy", "--x", tmp_path / "absent.npy",
                 "--out", out, check=False)
    assert result.returncode == 2
    assert out.read_bytes() == b"previous contents"


def test_plan_prints_json(cli):
    plan = json.loads(cli("plan", "elu-grad", "--shape", "4096,1024", "--dtype", "bf16",
                          "--threads", "2").stdout)
    assert plan["mode"] == "MIXED_EXP_FAST"
    assert plan["threads"] == 2
    assert plan["total_elems"] == 4096 * 1024
    assert plan["big_share_count"] * plan["big_share_elems"] + (
        plan["threads"] - plan["big_share_count"] - 1) * plan["small_share_elems"] + plan[
        "last_share_elems"] == plan["total_elems"]


def test_bench_json_has_the_fields(cli):
    lines = cli("bench", "elu-grad", "--elems", "65536", "--dtype", "f16", "--json",
                "--min-time", "0.02").stdout.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    for key in ("op", "dtype", "is_result", "elems", "threads", "gbps", "copy_gbps", "torch_gbps"):
        assert key in row
    assert row["elems"] == 65536 and row["dtype"] == "float16" and row["gbps"] > 0
