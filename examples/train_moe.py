#!/usr/bin/python3
"""Trains an MoE classifier on scikit-learn's handwritten digits twice from the same weights: once
with gradkit's MoeFFN, once with TorchMoeFFN (the same layer in plain PyTorch), and compares them.

    model: Linear(64, H) -> GELU -> x + MoeFFN(x) -> Linear(H, 10)

Prints both loss curves (sampled), the test accuracy of each on a held-out split, the step time
of each, and the peak memory of one training step of each at a larger synthetic size, each measured
in a process of its own. Saves a plot of the loss curves (--plot). Exits with status 1 when the
curves do not track each other or an accuracy is below --min-accuracy (see check_tracking).

    PYTHONPATH=python /usr/bin/python3 examples/train_moe.py            # from the repository root
    PYTHONPATH=python /usr/bin/python3 examples/train_moe.py --quick    # shorter (the test's run)
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import gradkit.torch as gkt

# The curves track each other when, after both are smoothed over SMOOTH steps, no step's losses
# differ by more than TRACK_ABS + TRACK_REL * (the plain-torch loss). The two runs start from the
# same weights and see the same batches; they differ only by float32 rounding (different summation
# orders), which Adam and the top-k router amplify over time but which must not move the curve.
SMOOTH = 20
TRACK_ABS = 0.02
TRACK_REL = 0.1


class Classifier(torch.nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.embed = torch.nn.Linear(64, moe.hidden)
        self.moe = moe
        self.head = torch.nn.Linear(moe.hidden, 10)

    def forward(self, pixels):
        x = torch.nn.functional.gelu(self.embed(pixels))
        return self.head(x + self.moe(x))


def make_models(args):
    """The gradkit model and the plain-torch one, with identical initial weights."""
    torch.manual_seed(args.seed)
    layer = dict(hidden=args.hidden, ffn_hidden=args.ffn, num_experts=args.experts,
                 topk=args.topk, activation="gelu")
    # grad_accumulation_fusion: the expert weights' gradients are added straight into .grad
    # (this loop's optimizer reads .grad after backward(); see docs/torch.md).
    ours = Classifier(gkt.MoeFFN(**layer, grad_accumulation_fusion=True))
    peer = Classifier(gkt.TorchMoeFFN(**layer))
    peer.load_state_dict(ours.state_dict())
    return ours, peer


def load_data(seed):
    from sklearn.datasets import load_digits
    digits = load_digits()
    pixels = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # values 0..16
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test = order[:len(order) // 5]   # 20% held out, never trained on
    train = order[len(order) // 5:]
    return (pixels[train], labels[train]), (pixels[test], labels[test])


def progress(step, steps, losses):
    width = 30
    done = width * step // steps
    sys.stdout.write(f"\r  [{'#' * done}{'.' * (width - done)}] step {step}/{steps}  "
                     f"loss gradkit {losses[0]:.4f}  torch {losses[1]:.4f}")
    sys.stdout.flush()


def train(models, train_set, args):
    """Trains both models on the same batches; returns their per-step losses and step times."""
    pixels, labels = train_set
    optimizers = [torch.optim.Adam(m.parameters(), lr=args.lr) for m in models]
    batches = torch.Generator().manual_seed(args.seed + 1)
    curves = ([], [])
    seconds = ([], [])
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(labels), (args.batch,), generator=batches)
        x, y = pixels[idx], labels[idx]
        for model, opt, curve, times in zip(models, optimizers, curves, seconds):
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
            curve.append(loss.item())
        if step % 10 == 0 or step == args.steps:
            progress(step, args.steps, (curves[0][-1], curves[1][-1]))
    sys.stdout.write("\n")
    return curves, seconds


def accuracy(model, test_set):
    pixels, labels = test_set
    with torch.no_grad():
        return (model(pixels).argmax(1) == labels).float().mean().item()


def smooth(curve):
    out, total = [], 0.0
    for i, v in enumerate(curve):
        total += v
        if i >= SMOOTH:
            total -= curve[i - SMOOTH]
        out.append(total / min(i + 1, SMOOTH))
    return out


def check_tracking(ours, peer):
    """(worst step, its gap, the allowed gap) over the smoothed curves."""
    worst = None
    for step, (a, b) in enumerate(zip(smooth(ours), smooth(peer)), 1):
        gap, allowed = abs(a - b), TRACK_ABS + TRACK_REL * b
        if worst is None or gap - allowed > worst[1] - worst[2]:
            worst = (step, gap, allowed)
    return worst


def save_plot(curves, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = range(1, len(curves[0]) + 1)
    ax.plot(steps, curves[1], label="TorchMoeFFN (plain PyTorch)", alpha=0.8)
    ax.plot(steps, curves[0], label="MoeFFN (gradkit)", alpha=0.8, linestyle="--")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross entropy)")
    ax.set_yscale("log")
    ax.set_title("MoE classifier on sklearn digits")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Peak memory of one training step at a larger size, one process per layer.

def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak():
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_probe(kind, args):
    """Prints the peak RSS increase (MiB) of one forward + backward of the layer, after a warm-up
    step, over the RSS at its start (parameters, their gradients and the input already there)."""
    torch.manual_seed(args.seed)
    shape = (args.mem_hidden, args.mem_ffn, args.mem_experts, args.mem_topk, "gelu")
    layer = (gkt.MoeFFN(*shape, grad_accumulation_fusion=True) if kind == "gradkit"
             else gkt.TorchMoeFFN(*shape))
    x = torch.randn(args.mem_batch, args.mem_hidden, requires_grad=True)
    dout = torch.randn(args.mem_batch, args.mem_hidden)

    def step():
        layer(x).backward(dout)

    step()  # warm-up: allocates the gradients and whatever the libraries keep
    if not _reset_peak():
        raise SystemExit("memory probe: cannot reset the peak RSS (/proc/self/clear_refs)")
    base = _rss_kib("VmRSS")
    step()
    peak = _rss_kib("VmHWM")
    print(f"peak_step_mib {(peak - base) / 1024:.1f}")


def measure_memory(args):
    """Runs the probe for each layer in a fresh process; returns {kind: MiB}."""
    env = dict(os.environ)
    # Every large block straight from mmap and back to the system on free: otherwise glibc keeps
    # freed blocks in its heap after the warm-up step and the measured step reuses them unseen.
    env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    result = {}
    for kind in ("gradkit", "torch"):
        cmd = [sys.executable, os.path.abspath(__file__), "--memory-probe", kind,
               "--mem-batch", str(args.mem_batch), "--mem-hidden", str(args.mem_hidden),
               "--mem-ffn", str(args.mem_ffn), "--mem-experts", str(args.mem_experts),
               "--mem-topk", str(args.mem_topk)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"memory probe ({kind}) failed:\n{out.stderr}")
        line = [l for l in out.stdout.splitlines() if l.startswith("peak_step_mib")][-1]
        result[kind] = float(line.split()[1])
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    p.add_argument("--quick", action="store_true",
                   help="a short run: 250 steps, a smaller memory probe (the test's settings)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    p.add_argument("--plot", default="train_moe.png", help="PNG of the loss curves")
    # The classifier's matmuls are tiny: a second thread only adds synchronisation (and on a
    # shared machine, waits for a busy core), so one thread is the default.
    p.add_argument("--threads", type=int, default=1, help="threads for torch and gradkit")
    p.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    p.add_argument("--mem-batch", type=int, default=4096)
    p.add_argument("--mem-hidden", type=int, default=1024)
    p.add_argument("--mem-ffn", type=int, default=2816)
    p.add_argument("--mem-experts", type=int, default=8)
    p.add_argument("--mem-topk", type=int, default=2)
    p.add_argument("--memory-probe", choices=("gradkit", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1 or args.steps < 1:
        p.error(f"--threads is {args.threads} and --steps {args.steps}; both must be >= 1")
    if args.quick:
        args.steps = min(args.steps, 250)
        args.mem_batch, args.mem_hidden, args.mem_ffn = 1024, 256, 704
    return args


def main(argv=None):
    args = parse_args(argv)
    threads = args.threads
    torch.set_num_threads(threads)
    gkt.ops.set_num_threads(threads)
    if args.memory_probe:
        memory_probe(args.memory_probe, args)
        return 0

    train_set, test_set = load_data(args.seed)
    print(f"digits: {len(train_set[1])} training images, {len(test_set[1])} held out; "
          f"MoE H {args.hidden}, F {args.ffn}, {args.experts} experts, top-{args.topk}; "
          f"batch {args.batch}, Adam lr {args.lr}, {args.steps} steps, {threads} threads")
    models = make_models(args)
    curves, seconds = train(models, train_set, args)

    print("loss curves (step: gradkit / torch):")
    marks = sorted({1, *range(args.steps // 10, args.steps + 1, max(1, args.steps // 10))})
    print("  " + "  ".join(f"{s}: {curves[0][s - 1]:.3f}/{curves[1][s - 1]:.3f}" for s in marks))
    step, gap, allowed = check_tracking(*curves)
    tracks = gap <= allowed
    print(f"curves track: {'yes' if tracks else 'NO'} (smoothed over {SMOOTH} steps, largest gap "
          f"{gap:.4f} at step {step}, allowed {allowed:.4f} = {TRACK_ABS} + {TRACK_REL} x loss)")

    acc = [accuracy(m, test_set) for m in models]
    print(f"test accuracy: gradkit {acc[0]:.2%}, torch {acc[1]:.2%} "
          f"(required >= {args.min_accuracy:.0%})")
    # The first steps warm caches and thread pools up: the median of the rest.
    med = [statistics.median(s[min(5, len(s) - 1):]) for s in seconds]
    print(f"step time (median): gradkit {med[0] * 1e3:.2f} ms, torch {med[1] * 1e3:.2f} ms "
          f"(torch / gradkit = {med[1] / med[0]:.2f}x)")

    if not args.no_memory:
        mib = measure_memory(args)
        print(f"peak memory of one training step (forward + backward of the layer, batch "
              f"{args.mem_batch}, H {args.mem_hidden}, F {args.mem_ffn}, {args.mem_experts} "
              f"experts, top-{args.mem_topk}, float32, separate processes): gradkit "
              f"{mib['gradkit']:.0f} MiB, torch {mib['torch']:.0f} MiB "
              f"(gradkit / torch = {mib['gradkit'] / mib['torch']:.2f})")

    save_plot(curves, args.plot)
    print(f"plot: {args.plot}")
    ok = tracks and min(acc) >= args.min_accuracy
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
