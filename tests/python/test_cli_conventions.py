"""What a new user meets first: usage and --version, options in any position, errors that name
the option typed, notes and warnings for what would otherwise pass in silence, and the mix-ups
of MoE routing inputs that the checks can catch (or at least make visible)."""
import re
import json
import os

import numpy as np
import pytest


def one_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradkit: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---- usage, version, global options ----------------------------------------------------------

@pytest.mark.parametrize("args", [[], ["help"], ["--help"]])
def test_usage_lists_the_commands(cli, args):
    r = cli(*args)
    assert "Usage: gradkit" in r.stdout
    for command in ("elu-grad", "moe-grad", "plan", "bench", "info", "help"):
        assert command in r.stdout


def test_help_of_a_command_and_of_a_group(cli):
    r = cli("help", "plan", "moe-grad")
    assert "Usage: gradkit plan moe-grad" in r.stdout and "--preset" in r.stdout
    assert "Usage: gradkit plan" in cli("plan").stdout
    one_error(cli("help", "nothing-like-this", check=False), "no command 'nothing-like-this'")


def test_version(cli):
    r = cli("--version")
    assert r.stdout.startswith("gradkit ") and r.stdout.split()[1][0].isdigit()


def test_isa_after_the_subcommand_and_in_any_case(cli):
    available = cli("info").stdout.split("available: ")[1].split(")")[0].split(", ")
    isa = available[-1]
    for args in (["--isa", isa.lower(), "info"], ["info", "--isa", isa.lower()]):
        assert f"cpu isa:    {isa} " in cli(*args).stdout
    one_error(cli("info", "--isa", "no-such-isa", check=False), "--isa is 'no-such-isa'")


def test_info_names_the_libraries_and_each_dtypes_gemm(cli):
    out = cli("info").stdout
    assert "libtorch:" in out and "oneDNN:" in out
    for dtype in ("float32", "float16", "bfloat16"):
        assert f"moe gemm:   {dtype}" in out


def test_unreadable_thread_variable_is_warned_about(cli):
    import subprocess
    env = dict(os.environ, GRADKIT_NUM_THREADS="abc")
    r = subprocess.run([os.environ.get("GRADKIT_CLI", "build/release/bin/gradkit"), "info"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0
    assert "warning: GRADKIT_NUM_THREADS is 'abc'" in r.stderr


# ---- bench and plan options -------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--elems", "-5"], "--elems is -5, it must be >= 1"),
    (["--elems", "0"], "--elems is 0, it must be >= 1"),
    (["--threads", "5000"], "--threads is 5000"),
    (["--threads", "-1"], "--threads is -1"),
    (["--min-time", "0"], "--min-time is 0"),
])
def test_bench_elu_grad_refuses_bad_numbers(cli, args, needle):
    one_error(cli("bench", "elu-grad", *args, check=False), needle)


@pytest.mark.parametrize("args,needle", [
    (["--preset", "S9"], "--preset is 'S9'"),
    (["--shape", "S1"], "--preset S1..S4 or --batch"),
    (["--batch", "0"], "--batch is 0"),
    (["--threads", "5000"], "--threads is 5000"),
])
def test_bench_moe_grad_refuses_bad_options(cli, args, needle):
    one_error(cli("bench", "moe-grad", *args, check=False), needle)


def test_bench_moe_grad_takes_a_users_shape(cli):
    r = cli("bench", "moe-grad", "--batch", 96, "--topk", 2, "--experts", 3, "--k", 80, "--n", 48,
            "--dtype", "f32", "--threads", 1, "--json", "--min-time", "0.01")
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["shape"] == "user" and row["gflops"] > 0
    assert row["unfused_bytes"] <= 96 * 2 * 80 * 4  # [M, K] float32 with M <= batch * topk


@pytest.mark.parametrize("op", ["grouped-matmul", "grouped-matmul-weight-grad"])
def test_bench_grouped_matmul_takes_a_users_shape(cli, op):
    r = cli("bench", op, "--batch", 96, "--topk", 2, "--experts", 3, "--k", 80, "--n", 48,
            "--dtype", "f32", "--threads", 1, "--json", "--min-time", "0.01")
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["shape"] == "user" and row["plain_gflops"] > 0
    assert (row["batch"], row["topK"], row["G"], row["K"], row["N"]) == (96, 2, 3, 80, 48)


@pytest.mark.parametrize("args,needle", [
    (["--preset", "S9"], "--preset is 'S9'"),
    (["--k", "0"], "--k is 0"),
    (["--experts", "5000"], "--experts is 5000"),
])
def test_bench_grouped_matmul_refuses_bad_shapes(cli, args, needle):
    one_error(cli("bench", "grouped-matmul", *args, check=False), needle)


def test_bench_moe_grad_help_lists_the_presets(cli):
    out = cli("bench", "moe-grad", "--help").stdout
    for preset in ("S1", "S2", "S3", "S4"):
        assert preset + " (batch" in out


def test_moe_grad_help_shows_defaults(cli):
    out = cli("moe-grad", "--help").stdout
    options = {l.split()[0]: l for l in out.splitlines() if l.strip().startswith("--")}
    # CLI11 2.3 (Debian 12) prints "INT=0", 2.4 (Debian 13) "INT [0]".
    assert re.search(r"INT(=0| \[0\])", options["--row-idx-type"]), options["--row-idx-type"]
    assert re.search(r"TEXT(=count| \[count\])", options["--group-list-type"]), options["--group-list-type"]


# ---- elu-grad: messages in the CLI's terms, notes and warnings ---------------------------------

def elu_files(tmp_path, dy_dtype=np.float32, x_dtype=np.float32):
    np.save(tmp_path / "dy.npy", np.linspace(-1, 1, 8).astype(dy_dtype))
    np.save(tmp_path / "x.npy", np.linspace(-2, 2, 8).astype(x_dtype))
    return ["elu-grad", "--dy", tmp_path / "dy.npy", "--x", tmp_path / "x.npy"]


def test_output_directory_is_refused_by_name(cli, tmp_path):
    args = elu_files(tmp_path)
    (tmp_path / "d").mkdir()
    one_error(cli(*args, "--out", f"{tmp_path}/d/", check=False), "--out is", "a directory")
    one_error(cli(*args, "--out", tmp_path / "d", check=False), "--out is", "a directory")
    one_error(cli(*args, "--out", tmp_path / "nowhere" / "y.npy", check=False),
              "--out is", "does not exist")


def test_bf16_output_is_said_to_be_float32(cli, tmp_path):
    r = cli(*elu_files(tmp_path), "--out", tmp_path / "y.npy", "--dtype", "bf16")
    assert "note:" in r.stderr and "widened to float32" in r.stderr
    assert np.load(tmp_path / "y.npy").dtype == np.float32
    assert "bfloat16" in cli("elu-grad", "--help").stdout
    quiet = cli(*elu_files(tmp_path), "--out", tmp_path / "y.npy", "--dtype", "bf16", "--quiet")
    assert quiet.stderr == ""


def test_mixed_file_dtypes_are_warned_about(cli, tmp_path):
    r = cli(*elu_files(tmp_path, np.float32, np.float16), "--out", tmp_path / "y.npy")
    assert r.stderr.count("\n") == 1 and "warning: --dy holds float32 and --x float16" in r.stderr
    same = cli(*elu_files(tmp_path), "--out", tmp_path / "y.npy")
    assert same.stderr == ""


# ---- moe-grad: summary and mix-ups ------------------------------------------------------------

def routing(batch, top_k, experts, drop, seed):
    """Slots -> experts with some dropped; gather (row -> slot), scatter (slot -> row), counts."""
    rng = np.random.default_rng(seed)
    expert = rng.integers(0, experts, batch * top_k)
    expert[rng.random(batch * top_k) < drop] = -1
    kept = np.flatnonzero(expert >= 0)
    gather = kept[np.argsort(expert[kept], kind="stable")]
    scatter = np.full(batch * top_k, -1, np.int64)
    scatter[gather] = np.arange(len(gather))
    return gather.astype(np.int64), scatter, np.bincount(expert[kept], minlength=experts)


def moe_case(tmp_path, batch=40, top_k=2, experts=3, k=16, n=8, drop=0.2, seed=1):
    gather, scatter, counts = routing(batch, top_k, experts, drop, seed)
    m = len(gather)
    np.save(tmp_path / "dy.npy", np.ones((m, n), np.float32))
    np.save(tmp_path / "w.npy", np.ones((experts, k, n), np.float32))
    np.save(tmp_path / "w_nk.npy", np.ones((experts, n, k), np.float32))
    np.save(tmp_path / "gather.npy", gather)
    np.save(tmp_path / "scatter.npy", scatter)
    np.save(tmp_path / "counts.npy", counts.astype(np.int64))
    return gather, scatter, counts


def moe_args(tmp_path, index="gather.npy", weight="w.npy", batch=40, top_k=2, row_idx_type=0):
    return ["moe-grad", "--grad-y", tmp_path / "dy.npy", "--weight", tmp_path / weight,
            "--expanded-row-idx", tmp_path / index, "--group-list", tmp_path / "counts.npy",
            "--batch", batch, "--topk", top_k, "--row-idx-type", row_idx_type,
            "--out", tmp_path / "dx.npy"]


def test_summary_line_describes_the_routing(cli, tmp_path):
    gather, _, counts = moe_case(tmp_path)
    r = cli(*moe_args(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradkit: note: routing: "), r.stderr
    idle = 40 - len(np.unique(gather // 2))
    expected = (f"40 tokens x topk 2 = 80 slots -> {len(gather)} rows, {80 - len(gather)} slots "
                f"dropped, {idle} tokens without a row; rows per expert: min {counts.min()} "
                f"(expert {counts.argmin()}), max {counts.max()} (expert {counts.argmax()}) over 3 experts")
    assert expected in lines[0], lines[0]
    assert cli(*moe_args(tmp_path), "--quiet").stderr == ""


def test_summary_shows_a_wrong_topk(cli, tmp_path):
    # Routed with topk 2, run with topk 3: every check passes, but a third of the tokens get nothing.
    gather, _, _ = moe_case(tmp_path, drop=0.0)
    r = cli(*moe_args(tmp_path, top_k=3))
    idle = 40 - len(np.unique(gather // 3))
    assert idle >= 13 and f"{idle} tokens without a row" in r.stderr
    assert "40 slots dropped" in r.stderr


def test_scatter_index_declared_gather_is_named(cli, tmp_path):
    moe_case(tmp_path)
    one_error(cli(*moe_args(tmp_path, index="scatter.npy", row_idx_type=0), check=False),
              "--expanded-row-idx[", "valid scatter index: is it --row-idx-type 1?")
    assert not (tmp_path / "dx.npy").exists()


def test_gather_index_declared_scatter_is_named(cli, tmp_path):
    moe_case(tmp_path)
    one_error(cli(*moe_args(tmp_path, index="gather.npy", row_idx_type=1), check=False),
              "--expanded-row-idx has", "the length of a gather index: is it --row-idx-type 0?")


def test_scatter_values_out_of_range_get_the_hint(cli, tmp_path):
    # A gather index padded to one entry per slot: the length of a scatter index, gather values.
    gather, _, _ = moe_case(tmp_path)
    np.save(tmp_path / "padded.npy", np.concatenate([gather, np.zeros(80 - len(gather), np.int64)]))
    line = one_error(cli(*moe_args(tmp_path, index="padded.npy", row_idx_type=1), check=False),
                     "--row-idx-type 1")
    assert "valid gather index: is it --row-idx-type 0?" in line


def test_weight_in_linear_layout_is_named(cli, tmp_path):
    moe_case(tmp_path)
    one_error(cli(*moe_args(tmp_path, weight="w_nk.npy"), check=False),
              "K and N look swapped", "nn.Linear", "--transpose-weight")


def test_transpose_weight_reads_linear_layout(cli, tmp_path):
    """--transpose-weight takes nn.Linear's [G, N, K] as it is: the bytes of the [G, K, N] run."""
    moe_case(tmp_path)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 16, 8)).astype(np.float32)
    dy = rng.standard_normal(np.load(tmp_path / "dy.npy").shape).astype(np.float32)
    np.save(tmp_path / "dy.npy", dy)
    np.save(tmp_path / "w.npy", w)
    np.save(tmp_path / "w_nk.npy", np.ascontiguousarray(w.transpose(0, 2, 1)))
    cli(*moe_args(tmp_path), "-q")
    gkn = np.load(tmp_path / "dx.npy")
    cli(*moe_args(tmp_path, weight="w_nk.npy"), "--transpose-weight", "-q")
    assert np.array_equal(np.load(tmp_path / "dx.npy"), gkn)
    one_error(cli(*moe_args(tmp_path), "--transpose-weight", check=False),
              "--transpose-weight", "looks [G, K, N] already")
