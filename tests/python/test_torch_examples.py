"""The PyTorch examples run as a user runs them (a fresh interpreter, PYTHONPATH=python) and pass
their own checks: examples/train_moe.py in quick mode, examples/expert_parallel.py on 2 ranks."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def run_example(script, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, str(ROOT / "examples" / script), *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def test_train_moe_quick(gkt, tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    plot = tmp_path / "curves.png"
    result = run_example("train_moe.py", "--quick", "--plot", plot)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "curves track: yes" in out
    acc = re.search(r"test accuracy: gradkit ([\d.]+)%, torch ([\d.]+)%", out)
    assert acc and min(float(acc[1]), float(acc[2])) >= 95.0, out
    assert re.search(r"step time \(median\): gradkit [\d.]+ ms, torch [\d.]+ ms", out), out
    mem = re.search(r"separate processes\): gradkit (\d+) MiB, torch (\d+) MiB", out)
    assert mem and int(mem[1]) > 0 and int(mem[2]) > 0, out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.rstrip().endswith("OK")


def test_train_moe_fails_below_the_accuracy_it_requires(gkt, tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    # No model reaches more than 100%: the script must report it and exit non-zero.
    result = run_example("train_moe.py", "--steps", 20, "--no-memory", "--min-accuracy", 1.01,
                         "--plot", tmp_path / "p.png")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("FAILED")


def test_expert_parallel_matches_the_single_process_layer(gkt):
    result = run_example("expert_parallel.py")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for name in ("output", "grad x", "grad router", "grad w1 (own experts)",
                 "grad w2 (own experts)"):
        line = re.search(rf"  {re.escape(name)} +([\d.e+-]+) .* ok$", out, re.M)
        assert line, f"no 'ok' line for {name}:\n{out}"
    assert out.rstrip().endswith("OK")


def test_expert_parallel_exits_non_zero_when_out_of_tolerance(gkt):
    # Tolerance 0: the router's gradient is summed over the ranks in another order than the
    # single-process matmul sums it, so some difference is non-zero and must be reported.
    result = run_example("expert_parallel.py", "--rtol", 0)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "OUT" in result.stdout and "FAILED" in result.stdout


def test_torch_guide_blocks_run(gkt):
    """docs/torch.md's Python blocks run as written (a fresh interpreter, PYTHONPATH=python)."""
    text = (ROOT / "docs" / "torch.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/torch.md has no Python example"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    for code in blocks:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, cwd=ROOT, timeout=120)
        assert result.returncode == 0, result.stderr
