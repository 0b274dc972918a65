"""An opt-in switch that sends PyTorch's own ELU backward (``aten::elu_backward`` on CPU) to
gradkit, so unchanged models using nn.ELU, nn.SELU, nn.CELU (or F.elu / F.selu / F.celu) run their
backward on gradkit's EluGradV2:

    with gkt.aten_elu_backward_on_gradkit():
        loss.backward()

It overrides the operator's CPU kernel through torch.library (torch warns once that a kernel is
overridden) and restores torch's own when the block ends. float32, float16 and bfloat16 with
matching dtypes and shapes go to gradkit; anything else (float64, mixed dtypes, broadcasting) is
computed by the same formula in plain torch ops.
"""
import contextlib
import threading

import torch

from gradkit.torch._library import load

_lock = threading.Lock()
_state = {"library": None, "depth": 0, "calls": 0}
_GRADKIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _formula(grad_output, alpha, scale, input_scale, is_result, x):
    """elu_backward's formula (torch's own) for what gradkit does not take."""
    negcoef, poscoef, negiptcoef = alpha * scale, scale, input_scale
    if is_result:
        negative = grad_output * negiptcoef * (x + negcoef)
    else:
        negative = grad_output * negiptcoef * negcoef * torch.exp(x * negiptcoef)
    return torch.where(x > 0, grad_output * poscoef, negative)


def _elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    if (grad_output.dtype in _GRADKIT_DTYPES and self_or_result.dtype == grad_output.dtype
            and self_or_result.shape == grad_output.shape):
        _state["calls"] += 1
        return load().elu_grad_v2(grad_output, self_or_result, float(alpha), float(scale),
                                  float(input_scale), bool(is_result))
    return _formula(grad_output, alpha, scale, input_scale, is_result, self_or_result)


@contextlib.contextmanager
def aten_elu_backward_on_gradkit():
    """Within the block, aten::elu_backward on CPU runs on gradkit (blocks may nest)."""
    with _lock:
        if _state["depth"] == 0:
            library = torch.library.Library("aten", "IMPL", "CPU")
            library.impl("elu_backward", _elu_backward)
            _state["library"] = library
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                _state["library"] = None  # deregisters: torch's own kernel is back


def aten_elu_backward_calls():
    """How many aten::elu_backward calls gradkit has computed (for tests and checks)."""
    return _state["calls"]
