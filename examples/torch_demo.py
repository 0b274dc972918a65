"""gradkit from PyTorch in a few lines: run by scripts/demo after the CLI's demo.

    PYTHONPATH=python /usr/bin/python3 examples/torch_demo.py

One MoE FFN layer on gradkit's operators beside the same layer in plain PyTorch (same weights):
their outputs and gradients agree, and gradkit's backward gives the same bits on every run.
"""
import time

import torch

import gradkit.torch as gkt


def train_step(module, x, dout):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    start = time.perf_counter()
    out = module(x)
    out.backward(dout)
    seconds = time.perf_counter() - start
    grads = [x.grad] + [p.grad for p in module.parameters()]
    return out.detach(), grads, seconds


def main():
    torch.manual_seed(0)
    hidden, ffn, experts, topk, tokens = 256, 512, 8, 2, 2048
    layer = gkt.MoeFFN(hidden, ffn, experts, topk, activation="gelu")
    peer = gkt.TorchMoeFFN(hidden, ffn, experts, topk, activation="gelu")
    peer.load_state_dict(layer.state_dict())
    x = torch.randn(tokens, hidden)
    dout = torch.randn(tokens, hidden)
    print(f"gradkit {gkt.version()} in torch {torch.__version__} ({gkt.ops.cpu_isa()}, "
          f"{gkt.ops.get_num_threads()} threads): MoeFFN H {hidden}, F {ffn}, {experts} experts, "
          f"top-{topk}, {tokens} tokens")

    train_step(layer, x, dout)  # warm-up: first-call setup in oneDNN and torch
    train_step(peer, x, dout)
    # Three steps of each in turn, medians: one step of a layer this small moves by 2x on a busy
    # machine (page faults of torch's fresh activations dominate it, docs/torch.md).
    t_gk, t_torch = [], []
    for _ in range(3):
        out, grads, seconds = train_step(layer, x, dout)
        t_gk.append(seconds)
        ref_out, ref_grads, seconds = train_step(peer, x, dout)
        t_torch.append(seconds)
    t_gk, t_torch = sorted(t_gk)[1], sorted(t_torch)[1]
    names = ["x"] + [name for name, _ in layer.named_parameters()]
    worst = max((g - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
                for g, r in zip([out] + grads, [ref_out] + ref_grads))
    print(f"  forward + backward (median of 3): gradkit {t_gk * 1e3:.1f} ms, plain torch {t_torch * 1e3:.1f} ms")
    print(f"  output and gradients of {', '.join(names)} vs plain torch: "
          f"largest difference {worst:.1e} of each tensor's scale")
    _, again, _ = train_step(layer, x, dout)
    same = all(torch.equal(a, b) for a, b in zip(grads, again))
    print(f"  second backward gives the same bits: {'yes' if same else 'NO'}")
    if worst > 1e-4 or not same:
        raise SystemExit("torch demo: gradkit's MoeFFN disagrees with plain torch or itself")


if __name__ == "__main__":
    main()
