"""gradkit: native backward operators for training (C API, CLI, and PyTorch).

The PyTorch side lives in :mod:`gradkit.torch` (``import gradkit.torch``); it needs the
extension module that ``scripts/build`` builds when libtorch is installed.
"""
