"""Peak memory of the CLI (issue: the output must not be held twice). A run may hold its inputs,
its output and the operator's workspace once each, plus 100 MiB of runtime (libraries, heap,
threads). An extra copy of the output (512 MiB for moe-grad, 256 MiB for elu-grad) breaks the
bound, and so would libtorch linked into the CLI (~160 MiB: its benchmark peer is a module that
only `gradkit bench` loads)."""
import json
import os
import subprocess
import sys

import numpy as np

MiB = 1 << 20
RUNTIME_ALLOWANCE = 100 * MiB

# Runs a command and prints its peak RSS in bytes. A small launcher of its own, so that the
# measured process is not forked from pytest: Linux counts the parent's RSS at fork into the
# child's ru_maxrss.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
"""


def peak_rss(cli, args, cwd):
    out = subprocess.run([sys.executable, "-c", LAUNCHER, cli, *map(str, args)], cwd=cwd,
                         capture_output=True, text=True, check=True)
    code, rss = map(int, out.stdout.split())
    assert code == 0, f"gradkit {' '.join(map(str, args))} exited {code}: {out.stderr}"
    return rss


def cli_path():
    return os.environ.get("GRADKIT_CLI", "build/release/bin/gradkit")


def check_bound(cli, tmp_path, args, data_bytes, workspace_bytes):
    peak = peak_rss(cli, args, tmp_path)
    bound = data_bytes + workspace_bytes + RUNTIME_ALLOWANCE
    print(f"peak {peak / MiB:.0f} MiB; inputs + output {data_bytes / MiB:.0f} MiB, workspace "
          f"{workspace_bytes / MiB:.1f} MiB")
    assert peak <= bound, (f"peak RSS {peak / MiB:.0f} MiB > {bound / MiB:.0f} MiB = inputs + "
                           f"output {data_bytes / MiB:.0f} + workspace {workspace_bytes / MiB:.1f} "
                           f"+ 100 MiB of runtime")


def test_cli_does_not_load_libtorch():
    """libtorch, when the build found it, is loaded by `gradkit bench` alone."""
    cli = os.path.abspath(cli_path())
    ldd = subprocess.run(["ldd", cli], capture_output=True, text=True, check=True).stdout
    assert "libtorch" not in ldd and "libc10" not in ldd, ldd


def test_moe_grad_holds_each_buffer_once(tmp_path):
    cli = os.path.abspath(cli_path())
    batch, top_k, experts, k, n, m = 32768, 4, 8, 4096, 64, 65536
    rng = np.random.default_rng(0)
    slots = np.sort(rng.choice(batch * top_k, m, replace=False))
    expert = rng.integers(0, experts, m)
    gather = slots[np.argsort(expert, kind="stable")].astype(np.int64)
    np.save(tmp_path / "dy.npy", np.ones((m, n), np.float32))
    np.save(tmp_path / "w.npy", np.ones((experts, k, n), np.float32))
    np.save(tmp_path / "idx.npy", gather)
    np.save(tmp_path / "counts.npy", np.bincount(expert, minlength=experts).astype(np.int64))
    inputs = sum(os.path.getsize(tmp_path / f) for f in ("dy.npy", "w.npy", "idx.npy", "counts.npy"))
    output = batch * k * 4
    plan = json.loads(subprocess.run(
        [cli, "plan", "moe-grad", "--batch", str(batch), "--topk", str(top_k), "--experts",
         str(experts), "--k", str(k), "--n", str(n), "--m", str(m)],
        capture_output=True, text=True, check=True).stdout)
    check_bound(cli, tmp_path,
                ["moe-grad", "--grad-y", "dy.npy", "--weight", "w.npy", "--expanded-row-idx",
                 "idx.npy", "--group-list", "counts.npy", "--batch", batch, "--topk", top_k,
                 "--out", "dx.npy", "--quiet"],
                inputs + output, plan["workspace_bytes"])
    dx = np.load(tmp_path / "dx.npy", mmap_mode="r")
    assert dx.shape == (batch, k)
    token = gather[0] // top_k  # all-ones inputs: each row adds N to its token's row
    assert dx[token, 0] == n * np.count_nonzero(gather // top_k == token)


def test_elu_grad_holds_each_buffer_once(tmp_path):
    cli = os.path.abspath(cli_path())
    elems = 64 << 20
    np.save(tmp_path / "dy.npy", np.ones(elems, np.float32))
    np.save(tmp_path / "x.npy", np.full(elems, -1.0, np.float32))
    inputs = os.path.getsize(tmp_path / "dy.npy") + os.path.getsize(tmp_path / "x.npy")
    plan = json.loads(subprocess.run([cli, "plan", "elu-grad", "--shape", str(elems)],
                                     capture_output=True, text=True, check=True).stdout)
    check_bound(cli, tmp_path, ["elu-grad", "--dy", "dy.npy", "--x", "x.npy", "--out", "y.npy"],
                inputs + elems * 4, plan["workspace_bytes"])
    y = np.load(tmp_path / "y.npy", mmap_mode="r")
    assert y.shape == (elems,) and np.isclose(y[-1], np.exp(-1.0), rtol=1e-6)
