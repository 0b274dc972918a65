import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("GRADKIT_CLI", str(ROOT / "build" / "release" / "bin" / "gradkit"))
    if not os.path.exists(path):
        pytest.fail(f"gradkit CLI not found at {path}; run scripts/build first")

    def run(*args, check=True):
        result = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        if check and result.returncode != 0:
            raise AssertionError(f"gradkit {' '.join(map(str, args))} failed:\n{result.stderr}")
        return result

    return run


# The torch extension's Python package, as a user reaches it: PYTHONPATH=python.
sys.path.insert(0, str(ROOT / "python"))


@pytest.fixture(scope="session")
def gkt():
    """gradkit.torch, loaded from the build (skipped only where torch itself is missing)."""
    pytest.importorskip("torch")
    import gradkit.torch
    return gradkit.torch
