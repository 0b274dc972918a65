"""The CLI under hostile files and paths: malformed, truncated or oversized .npy files, missing
inputs and unwritable outputs all exit with status 2 and one line on stderr, create no output,
and leave an existing output file as it was; a successful run replaces it whole."""
import os
import struct

import numpy as np
import pytest


def save(path, array):
    np.save(path, array)
    return path


def npy_bytes(header, payload=b"", version=1):
    header = header.encode("latin1")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + payload
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(header)) + header + payload


def header(descr="<f4", shape="(4,)", fortran="False"):
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }\n" % (descr, fortran, shape)


VALID_F4 = npy_bytes(header(), np.ones(4, np.float32).tobytes())

# name -> (file contents, text the one-line message must contain)
MALFORMED = {
    "empty": (b"", "not a .npy file"),
    "bad_magic": (b"\x93NUMPX\x01\x00" + VALID_F4[8:], "not a .npy file"),
    "text": (b"just some text, not an array", "not a .npy file"),
    "version_9": (b"\x93NUMPY\x09\x00" + VALID_F4[8:], "format version 9"),
    "header_truncated": (VALID_F4[:20], "header is truncated"),
    "v2_header_truncated": (b"\x93NUMPY\x02\x00\xff\xff\x00\x00{'descr'", "header is truncated"),
    "data_truncated": (VALID_F4[:-3], "data is truncated"),
    "no_payload": (npy_bytes(header(shape="(1000,)")), "data is truncated"),
    "shape_oversized": (npy_bytes(header(shape="(4294967296, 4294967296)")), "too large"),
    "shape_past_int64": (npy_bytes(header(shape="(999999999999999999, 99)")), "too large"),
    "shape_negative": (npy_bytes(header(shape="(-4,)")), "bad dimension"),
    "shape_not_closed": (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4, \n"),
                         "not closed"),
    "shape_missing": (npy_bytes("{'descr': '<f4', 'fortran_order': False, }\n"), "has no shape"),
    "descr_missing": (npy_bytes("{'fortran_order': False, 'shape': (4,), }\n"), "has no descr"),
    "big_endian": (npy_bytes(header(descr=">f4"), b"\0" * 16), "not supported"),
    "complex": (npy_bytes(header(descr="<c8"), b"\0" * 32), "not supported"),
    "fortran": (npy_bytes(header(fortran="True"), b"\0" * 16), "Fortran order"),
}


def assert_clean_failure(result, needle=None):
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradkit: error:"), result.stderr
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


def elu_args(tmp_path, dy, x=None, out=None):
    x = x or save(tmp_path / "x.npy", np.linspace(-2, 2, 4, dtype=np.float32))
    return ["elu-grad", "--dy", dy, "--x", x, "--out", out or tmp_path / "y.npy"]


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_npy_exits_2(cli, tmp_path, name):
    contents, needle = MALFORMED[name]
    bad = tmp_path / f"{name}.npy"
    bad.write_bytes(contents)
    out = tmp_path / "y.npy"
    line = assert_clean_failure(cli(*elu_args(tmp_path, bad, out=out), check=False), needle)
    assert str(bad) in line  # the message names the file
    assert not out.exists()


@pytest.mark.parametrize("cut", [0, 1, 7, 9, 10, 11, 40, len(VALID_F4) - 1])
def test_every_truncation_exits_2(cli, tmp_path, cut):
    bad = tmp_path / "cut.npy"
    bad.write_bytes(VALID_F4[:cut])
    assert_clean_failure(cli(*elu_args(tmp_path, bad), check=False))


def test_missing_inputs_exit_2(cli, tmp_path):
    dy = save(tmp_path / "dy.npy", np.ones(4, np.float32))
    absent = tmp_path / "absent.npy"
    assert_clean_failure(cli(*elu_args(tmp_path, absent), check=False), "cannot open")
    assert_clean_failure(cli(*elu_args(tmp_path, dy, x=absent), check=False), "cannot open")
    # A directory where a file is expected.
    assert_clean_failure(cli(*elu_args(tmp_path, tmp_path), check=False))


@pytest.mark.parametrize("where", ["missing_dir", "is_directory", "under_a_file"])
def test_unwritable_output_exits_2(cli, tmp_path, where):
    dy = save(tmp_path / "dy.npy", np.ones(4, np.float32))
    if where == "missing_dir":
        out = tmp_path / "no" / "such" / "dir" / "y.npy"
    elif where == "is_directory":
        out = tmp_path / "a_directory"
        out.mkdir()
    else:
        (tmp_path / "plain_file").write_bytes(b"x")
        out = tmp_path / "plain_file" / "y.npy"
    assert_clean_failure(cli(*elu_args(tmp_path, dy, out=out), check=False), "cannot write")
    leftovers = [p for p in os.listdir(tmp_path) if ".tmp." in p]
    assert leftovers == []
    if where == "is_directory":
        assert out.is_dir() and list(out.iterdir()) == []


def test_existing_output_survives_every_kind_of_failure(cli, tmp_path):
    out = tmp_path / "y.npy"
    out.write_bytes(b"previous contents")
    dy = save(tmp_path / "dy.npy", np.ones(4, np.float32))
    bad = tmp_path / "bad.npy"
    bad.write_bytes(VALID_F4[:-1])
    five = save(tmp_path / "five.npy", np.ones(5, np.float32))
    for args in (elu_args(tmp_path, bad, out=out),                  # truncated input
                 elu_args(tmp_path, dy, x=five, out=out),           # operator refuses shapes
                 elu_args(tmp_path, dy, out=out) + ["--alpha", "nan"],
                 elu_args(tmp_path, dy, out=out) + ["--dtype", "f64"]):
        assert_clean_failure(cli(*args, check=False))
        assert out.read_bytes() == b"previous contents"


def test_success_replaces_the_output_whole(cli, tmp_path):
    out = tmp_path / "y.npy"
    out.write_bytes(b"previous contents, longer than the new file would ever need to be " * 100)
    dy = save(tmp_path / "dy.npy", np.ones(4, np.float32))
    cli(*elu_args(tmp_path, dy, out=out))
    y = np.load(out)
    assert y.shape == (4,) and y.dtype == np.float32
    assert [p for p in os.listdir(tmp_path) if ".tmp." in p] == []


# ---- MoeInitRoutingGroupedMatmulGrad ------------------------------------------------------------

def moe_files(tmp_path):
    """batch 2, topK 2, G 2, K 3, N 4, M 3, gather indices."""
    return {
        "--grad-y": save(tmp_path / "dy.npy", np.ones((3, 4), np.float32)),
        "--weight": save(tmp_path / "w.npy", np.ones((2, 3, 4), np.float32)),
        "--expanded-row-idx": save(tmp_path / "idx.npy", np.array([0, 3, 1], np.int64)),
        "--group-list": save(tmp_path / "groups.npy", np.array([1, 2], np.int64)),
    }


def moe_args(files, out, **options):
    args = ["moe-grad"]
    for key, value in files.items():
        args += [key, value]
    settings = {"--batch": 2, "--topk": 2, "--out": out}
    settings.update({"--" + k.replace("_", "-"): v for k, v in options.items()})
    for key, value in settings.items():
        args += [key, value]
    return args


def test_moe_valid_call_runs(cli, tmp_path):
    out = tmp_path / "dx.npy"
    cli(*moe_args(moe_files(tmp_path), out))
    assert np.load(out).shape == (2, 3)


@pytest.mark.parametrize("name", ["truncated", "oversized", "garbage", "missing"])
@pytest.mark.parametrize("which", ["--grad-y", "--weight", "--expanded-row-idx", "--group-list"])
def test_moe_bad_files_exit_2(cli, tmp_path, which, name):
    files = moe_files(tmp_path)
    bad = tmp_path / "bad.npy"
    if name == "truncated":
        bad.write_bytes(open(files[which], "rb").read()[:-1])
    elif name == "oversized":
        bad.write_bytes(npy_bytes(header(descr="<i8", shape="(1099511627776, 1024)")))
    elif name == "garbage":
        bad.write_bytes(b"\x00" * 100)
    if name != "missing":
        files[which] = bad
    else:
        files[which] = tmp_path / "absent.npy"
    out = tmp_path / "dx.npy"
    out.write_bytes(b"previous contents")
    assert_clean_failure(cli(*moe_args(files, out), check=False))
    assert out.read_bytes() == b"previous contents"


@pytest.mark.parametrize("problem", [
    "index_out_of_range", "index_repeated", "index_minus_one_gather", "groups_short",
    "groups_negative", "groups_float", "batch_zero",
    "batch_huge", "batch_2_to_40",
    "topk_negative", "row_idx_type_7", "group_list_type_bad", "index_past_int32"])
def test_moe_bad_values_exit_2(cli, tmp_path, problem):
    files = moe_files(tmp_path)
    options = {}
    if problem == "index_out_of_range":
        files["--expanded-row-idx"] = save(tmp_path / "i.npy", np.array([0, 4, 1], np.int64))
    elif problem == "index_repeated":
        files["--expanded-row-idx"] = save(tmp_path / "i.npy", np.array([0, 3, 3], np.int64))
    elif problem == "index_minus_one_gather":
        files["--expanded-row-idx"] = save(tmp_path / "i.npy", np.array([0, -1, 1], np.int64))
    elif problem == "groups_short":
        files["--group-list"] = save(tmp_path / "g.npy", np.array([1, 1], np.int64))
    elif problem == "groups_negative":
        files["--group-list"] = save(tmp_path / "g.npy", np.array([-1, 4], np.int64))
    elif problem == "groups_float":
        files["--group-list"] = save(tmp_path / "g.npy", np.array([1.0, 2.0], np.float32))
    elif problem == "batch_zero":
        options["batch"] = 0
    elif problem == "batch_huge":
        options["batch"] = 2**63 - 1
    elif problem == "batch_2_to_40":
        options["batch"] = 2**40
    elif problem == "topk_negative":
        options["topk"] = -2
    elif problem == "row_idx_type_7":
        options["row_idx_type"] = 7
    elif problem == "group_list_type_bad":
        options["group_list_type"] = "sideways"
    elif problem == "index_past_int32":
        files["--expanded-row-idx"] = save(tmp_path / "i.npy", np.array([0, 2**40, 1], np.int64))
    out = tmp_path / "dx.npy"
    assert_clean_failure(cli(*moe_args(files, out, **options), check=False))
    assert not out.exists()


def test_moe_unwritable_output_exits_2(cli, tmp_path):
    out = tmp_path / "missing_dir" / "dx.npy"
    assert_clean_failure(cli(*moe_args(moe_files(tmp_path), out), check=False), "cannot write")
