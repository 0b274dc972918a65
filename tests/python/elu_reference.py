"""ELU backward references shared by the CLI's and the torch extension's tests."""
import numpy as np
import torch

CASES = [
    # alpha, scale, input_scale, is_result
    (1.0, 1.0, 1.0, False),                          # ELU
    (1.6732632423543772, 1.0507009873554805, 1.0, False),  # SELU
    (0.5, 1.0, 2.0, False),                          # CELU-like input scaling
    (1.0, 1.0, 1.0, True),
    (1.6732632423543772, 1.0507009873554805, 1.0, True),
]


def torch_reference(dy, x, alpha, scale, input_scale, is_result, dtype):
    """aten.elu_backward evaluated in float32 on the dtype-rounded inputs (fp16 via fp32, as
    PyTorch's CPU kernel has no half support), rounded once to the dtype."""
    dy32 = torch.from_numpy(dy).to(dtype).float()
    x32 = torch.from_numpy(x).to(dtype).float()
    y = torch.ops.aten.elu_backward(dy32, alpha, scale, input_scale, is_result, x32)
    return y.to(dtype).float().numpy(), dy32.double().numpy(), x32.double().numpy()


def float64_formula(dy, x, alpha, scale, input_scale, is_result):
    negcoef = np.float64(np.float32(alpha) * np.float32(scale))
    poscoef = np.float64(np.float32(scale))
    negiptcoef = np.float64(np.float32(input_scale))
    if is_result:
        neg = dy * negiptcoef * (x + negcoef)
    else:
        neg = dy * negiptcoef * negcoef * np.exp(x * negiptcoef)
    return np.where(x > 0, dy * poscoef, neg)


def tolerance(exact, x64, input_scale, ulp, subnormal_ulp):
    """Both gradkit and torch are float32 evaluations rounded once to the dtype: each lies within
    a few float32 ulps plus one ulp of the dtype of the float64 value, so of each other."""
    return ((8 * 2.0 ** -23 * (1 + np.abs(x64 * input_scale)) + 2 * ulp) * np.abs(exact)
            + subnormal_ulp)
