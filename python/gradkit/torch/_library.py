"""Finds and loads libgradkit_torch.so, which registers ``torch.ops.gradkit``."""
import os
import pathlib

import torch

LIBRARY_NAME = "libgradkit_torch.so"
# python/gradkit/torch/_library.py -> the repository root
_ROOT = pathlib.Path(__file__).resolve().parents[3]
# Build presets that build the extension, in the order they are tried.
_PRESETS = ("release", "debug")


def library_path():
    """The extension to load: $GRADKIT_TORCH_LIBRARY, else the first build/<preset>/lib that has it."""
    override = os.environ.get("GRADKIT_TORCH_LIBRARY")
    if override:
        if not os.path.isfile(override):
            raise ImportError(f"GRADKIT_TORCH_LIBRARY is {override!r}, which is not a file")
        return override
    tried = [_ROOT / "build" / preset / "lib" / LIBRARY_NAME for preset in _PRESETS]
    for path in tried:
        if path.is_file():
            return str(path)
    raise ImportError(
        f"gradkit's torch extension ({LIBRARY_NAME}) was not found in "
        f"{', '.join(str(p.parent) for p in tried)}: run scripts/build (it is built when libtorch "
        "is installed: Debian's libtorch-dev), or set GRADKIT_TORCH_LIBRARY to its path")


def load():
    """Loads the extension once; returns ``torch.ops.gradkit``."""
    if not _loaded:
        torch.ops.load_library(library_path())
        _loaded.append(True)
    return torch.ops.gradkit


_loaded = []
