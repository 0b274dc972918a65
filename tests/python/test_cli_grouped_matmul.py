"""`gradkit grouped-matmul` and `gradkit grouped-matmul-weight-grad` against composites built
from PyTorch in float64 (a per-expert mm over each expert's rows), from the same dtype-rounded
inputs; gather-fused x against the same composite of the expanded rows; errors in the options'
names."""
import numpy as np
import pytest
import torch

TOLERANCE = 1e-5  # x the sum of |terms| of each element (grouped_matmul_ref.h)
ROUNDING = {"f32": 0.0, "f16": 1.0 / 2048, "bf16": 1.0 / 256}  # x |reference|, dtype outputs


def routing(batch, top_k, experts, keep, rng, empty=()):
    """Slots routed to experts (-1: dropped); rows sorted by (expert, slot) as MoeInitRouting."""
    allowed = np.array([e for e in range(experts) if e not in empty])
    expert = rng.choice(allowed, size=batch * top_k)
    expert[rng.random(batch * top_k) >= keep] = -1
    slots = np.flatnonzero(expert >= 0)
    gather = slots[np.lexsort((slots, expert[slots]))]  # row -> slot
    counts = np.bincount(expert[slots], minlength=experts).astype(np.int64)
    scatter = np.full(batch * top_k, -1, dtype=np.int64)
    scatter[gather] = np.arange(len(gather))
    return gather.astype(np.int64), scatter, counts


def rounded(values, dtype):
    """The values the operator computes with: float32 input rounded to the dtype (RNE)."""
    t = torch.from_numpy(values.astype(np.float32))
    return {"f32": t, "f16": t.half(), "bf16": t.bfloat16()}[dtype].double()


def forward_composite(x, w, counts):
    """y and the magnitude of its terms: torch.mm per expert over its rows, float64."""
    y = torch.empty(x.shape[0], w.shape[2], dtype=torch.float64)
    magnitude = torch.empty_like(y)
    row = 0
    for e, rows in enumerate(counts.tolist()):
        y[row:row + rows] = x[row:row + rows].mm(w[e])
        magnitude[row:row + rows] = x[row:row + rows].abs().mm(w[e].abs())
        row += rows
    return y.numpy(), magnitude.numpy()


def weight_grad_composite(x, dy, counts):
    """gradWeight [G, K, N] and its terms' magnitude: x_g^T @ dy_g per expert, float64."""
    dw = torch.zeros(len(counts), x.shape[1], dy.shape[1], dtype=torch.float64)
    magnitude = torch.zeros_like(dw)
    row = 0
    for e, rows in enumerate(counts.tolist()):
        dw[e] = x[row:row + rows].t().mm(dy[row:row + rows])
        magnitude[e] = x[row:row + rows].abs().t().mm(dy[row:row + rows].abs())
        row += rows
    return dw.numpy(), magnitude.numpy()


def assert_within(got, reference, magnitude, out_dtype):
    bound = TOLERANCE * magnitude + ROUNDING[out_dtype] * np.abs(reference)
    excess = np.abs(got.astype(np.float64) - reference) - bound
    assert excess.max() <= 0, f"worst element off by {excess.max()} beyond the contract"


class Case:
    """One routing and its inputs, written as .npy files in tmp_path."""

    def __init__(self, tmp_path, batch=40, top_k=3, experts=5, k=48, n=40, keep=0.9, seed=0,
                 empty=(), integers=False):
        rng = np.random.default_rng(seed)
        self.gather, self.scatter, self.counts = routing(batch, top_k, experts, keep, rng, empty)
        self.top_k = top_k
        m = len(self.gather)
        draw = (lambda *s: rng.integers(-3, 4, size=s)) if integers else (lambda *s: rng.uniform(-1, 1, size=s))
        self.tokens = draw(batch, k).astype(np.float32)
        self.expanded = self.tokens[self.gather // top_k]
        self.w = draw(experts, k, n).astype(np.float32)
        self.dy = draw(m, n).astype(np.float32)
        self.path = tmp_path
        for name, array in [("tokens", self.tokens), ("x", self.expanded), ("w", self.w),
                            ("w_nk", np.ascontiguousarray(self.w.transpose(0, 2, 1))),
                            ("dy", self.dy), ("gather", self.gather),
                            ("gather32", self.gather.astype(np.int32)), ("scatter", self.scatter),
                            ("counts", self.counts), ("cumsum", np.cumsum(self.counts)),
                            ("counts32", self.counts.astype(np.int32))]:
            np.save(tmp_path / f"{name}.npy", array)

    def file(self, name):
        return str(self.path / f"{name}.npy")

    def x_args(self, form):
        """--x and the index options of an input form: plain, gather, scatter."""
        if form == "plain":
            return ["--x", self.file("x")]
        index = {"gather": "gather", "gather32": "gather32", "scatter": "scatter"}[form]
        return ["--x", self.file("tokens"), "--expanded-row-idx", self.file(index),
                "--row-idx-type", "1" if form == "scatter" else "0", "--topk", str(self.top_k)]


FORMS = [("plain", "count", "counts"), ("plain", "cumsum", "cumsum"), ("gather", "count", "counts32"),
         ("gather32", "cumsum", "cumsum"), ("scatter", "count", "counts")]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("form,group_type,group_file", FORMS)
@pytest.mark.parametrize("transpose", [False, True])
def test_forward_matches_torch(cli, tmp_path, dtype, form, group_type, group_file, transpose):
    case = Case(tmp_path, empty=(2,))
    out = tmp_path / "y.npy"
    cli("grouped-matmul", *case.x_args(form), "--weight", case.file("w_nk" if transpose else "w"),
        *(["--transpose-weight"] if transpose else []), "--group-list", case.file(group_file),
        "--group-list-type", group_type, "--dtype", dtype, "--out", out)
    y = np.load(out)
    assert y.dtype == (np.float16 if dtype == "f16" else np.float32)
    reference, magnitude = forward_composite(rounded(case.expanded, dtype), rounded(case.w, dtype), case.counts)
    assert_within(y, reference, magnitude, dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("form,group_type,group_file", FORMS)
@pytest.mark.parametrize("out_dtype", ["f32", "same"])
def test_weight_grad_matches_torch(cli, tmp_path, dtype, form, group_type, group_file, out_dtype):
    case = Case(tmp_path, empty=(1, 4))
    out = tmp_path / "dw.npy"
    target = dtype if out_dtype == "same" else "f32"
    cli("grouped-matmul-weight-grad", *case.x_args(form), "--grad-y", case.file("dy"),
        "--group-list", case.file(group_file), "--group-list-type", group_type, "--dtype", dtype,
        "--out-dtype", target, "--out", out)
    dw = np.load(out)
    assert dw.shape == case.w.shape
    reference, magnitude = weight_grad_composite(rounded(case.expanded, dtype), rounded(case.dy, dtype),
                                                 case.counts)
    assert_within(dw, reference, magnitude, target)
    assert not dw[1].any() and not dw[4].any()  # empty experts: zeros


def test_small_integers_are_exact(cli, tmp_path):
    """Small-integer inputs make every float32 sum exact: equal to the float64 composite."""
    case = Case(tmp_path, batch=64, top_k=2, experts=4, k=300, n=270, integers=True, seed=3)
    cli("grouped-matmul", *case.x_args("scatter"), "--weight", case.file("w"),
        "--group-list", case.file("counts"), "--out", tmp_path / "y.npy")
    y = np.load(tmp_path / "y.npy")
    np.testing.assert_array_equal(y, forward_composite(rounded(case.expanded, "f32"),
                                                       rounded(case.w, "f32"), case.counts)[0])
    cli("grouped-matmul-weight-grad", *case.x_args("gather"), "--grad-y", case.file("dy"),
        "--group-list", case.file("counts"), "--out", tmp_path / "dw.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "dw.npy"),
                                  weight_grad_composite(rounded(case.expanded, "f32"),
                                                        rounded(case.dy, "f32"), case.counts)[0])


def test_weight_grad_add_to(cli, tmp_path):
    """--add-to: the result is that gradient plus the weight gradient (GroupedMatmulWeightGradAdd),
    exact on small integers; an empty expert keeps its values; a wrong shape names --add-to."""
    case = Case(tmp_path, batch=64, top_k=2, experts=4, k=40, n=36, integers=True, seed=4,
                empty=(2,))
    prior = np.random.default_rng(1).integers(-50, 50, size=(4, 40, 36)).astype(np.float32)
    np.save(tmp_path / "prior.npy", prior)
    cli("grouped-matmul-weight-grad", *case.x_args("gather"), "--grad-y", case.file("dy"),
        "--group-list", case.file("counts"), "--add-to", tmp_path / "prior.npy",
        "--out", tmp_path / "dw.npy")
    want = prior + weight_grad_composite(rounded(case.expanded, "f32"), rounded(case.dy, "f32"),
                                         case.counts)[0]
    np.testing.assert_array_equal(np.load(tmp_path / "dw.npy"), want)
    assert np.array_equal(np.load(tmp_path / "dw.npy")[2], prior[2])
    np.save(tmp_path / "wrong.npy", prior[:, :, :35])
    result = cli("grouped-matmul-weight-grad", *case.x_args("gather"), "--grad-y",
                 case.file("dy"), "--group-list", case.file("counts"), "--add-to",
                 tmp_path / "wrong.npy", "--out", tmp_path / "bad.npy", check=False)
    assert result.returncode == 2 and "--add-to" in result.stderr, result.stderr
    assert not (tmp_path / "bad.npy").exists()


def test_gather_fused_gives_the_bytes_of_the_expanded_input(cli, tmp_path):
    case = Case(tmp_path, batch=70, top_k=4, experts=6, k=64, n=72, seed=5)
    outputs = []
    for form in ["plain", "gather", "scatter"]:
        out = tmp_path / f"y_{form}.npy"
        cli("grouped-matmul", *case.x_args(form), "--weight", case.file("w"), "--group-list",
            case.file("counts"), "--dtype", "bf16", "--threads", "2", "--out", out)
        outputs.append(np.load(out))
        out = tmp_path / f"dw_{form}.npy"
        cli("grouped-matmul-weight-grad", *case.x_args(form), "--grad-y", case.file("dy"),
            "--group-list", case.file("counts"), "--threads", "3", "--out", out)
        outputs.append(np.load(out))
    for a, b in zip(outputs[0::2], outputs[2::2]):
        assert np.array_equal(a, b)
    for a, b in zip(outputs[1::2], outputs[3::2]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("args,words", [
    # weight [G, N, K] without --transpose-weight
    (["grouped-matmul", "--x", "x", "--weight", "w_nk", "--group-list", "counts"],
     ["--x has 48 columns", "K and N look swapped", "--transpose-weight true"]),
    (["grouped-matmul", "--x", "x", "--weight", "w", "--transpose-weight", "--group-list", "counts"],
     ["K and N look swapped"]),
    (["grouped-matmul", "--x", "x", "--weight", "w", "--group-list", "cumsum"],
     ["--group-list[2]", "total more than M"]),
    (["grouped-matmul", "--x", "tokens", "--expanded-row-idx", "gather", "--weight", "w",
      "--group-list", "counts"], ["--expanded-row-idx needs --topk"]),
    (["grouped-matmul", "--x", "x", "--weight", "w", "--group-list", "counts", "--topk", "2"],
     ["--topk is given without --expanded-row-idx"]),
    (["grouped-matmul", "--x", "tokens", "--expanded-row-idx", "scatter", "--row-idx-type", "0",
      "--topk", "3", "--weight", "w", "--group-list", "counts"], ["--expanded-row-idx"]),
    (["grouped-matmul", "--x", "x", "--weight", "w", "--group-list", "counts",
      "--group-list-type", "sum"], ["--group-list-type is 'sum'"]),
    (["grouped-matmul-weight-grad", "--x", "x", "--grad-y", "w", "--group-list", "counts"],
     ["--grad-y", "dims"]),
    (["grouped-matmul-weight-grad", "--x", "tokens", "--grad-y", "dy", "--group-list", "counts"],
     ["--grad-y", "M, x.shape[0]"]),
    (["grouped-matmul-weight-grad", "--x", "x", "--grad-y", "dy", "--group-list", "counts",
      "--dtype", "bf16", "--out-dtype", "f16"], ["--out-dtype is f16"]),
])
def test_errors_name_the_options(cli, tmp_path, args, words):
    case = Case(tmp_path)
    argv = [case.file(a) if (i > 0 and args[i - 1] in ("--x", "--weight", "--grad-y", "--group-list",
                                                        "--expanded-row-idx")) else a
            for i, a in enumerate(args)]
    out = tmp_path / "out.npy"
    result = cli(*argv, "--out", out, check=False)
    assert result.returncode == 2, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    assert "gkGrouped" not in result.stderr
    assert not out.exists()


def test_plans_print_json(cli):
    import json
    forward = json.loads(cli("plan", "grouped-matmul", "--preset", "S2", "--transpose-weight").stdout)
    assert forward["op"] == "grouped_matmul" and forward["weight_layout"] == "GNK"
    assert forward["shape"] == {"M": 2048 * 8, "K": 2048, "N": 768, "G": 64}
    grad = json.loads(cli("plan", "grouped-matmul-weight-grad", "--row-idx-type", "1", "--dtype",
                          "bf16", "--threads", "64").stdout)
    assert grad["op"] == "grouped_matmul_weight_grad" and grad["x"] == "tokens"
    split = grad["work_split"]
    # 8 experts x K 2048 in groups of 2 blocks of 256 x N 1408 in one group: 8 blocks of 176, or
    # one of all N where bfloat16 writes float32 gradWeight from oneDNN's GEMMs (CPUs that do not
    # stream gradWeight: GroupedMatmulWholeRowTiles), or 11 of 128 (whole panels) where its 1024
    # rows an expert run on the dot-product kernel (Zen 5: bf16_dot_where_faster)
    assert grad["threads"] == 32 and grad["machine_threads"] == 64  # at most one per unit
    assert (split["k_group_blocks"], split["units"]) == (2, 8 * 4 * 1)
    on_dot = any("dot-product" in impl for impl in grad["gemm_impl"].values())
    columns = (128, 11, 11) if on_dot else (1408, 1, 1) if grad["out_direct"] else (176, 8, 8)
    assert (grad["base_n"], split["col_blocks"], split["n_group_blocks"]) == columns
    assert grad["out_direct"] != grad["stream_out"]
