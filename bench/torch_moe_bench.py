#!/usr/bin/python3
"""gradkit in PyTorch against plain PyTorch, in one process, interleaved (round after round, each
candidate once per round; medians), at the fused operator's shape S1 (batch 4096, topK 2,
8 experts, H 2048, F 1408):

  dx:     torch.ops.gradkit.moe_init_routing_grouped_matmul_grad (d_x of an expert matmul, fp32
          out) against the composite a torch user writes: per-expert mm into an [M, H] buffer,
          then index_add_ into d_x. float32 and bfloat16.
  step:   one training step (forward + backward) of MoeFFN against TorchMoeFFN, same weights;
          MoeFFN both as it comes and with grad_accumulation_fusion (weight gradients added
          straight into .grad).
  memory: the peak RSS increase of one such step, each layer in a process of its own.

    PYTHONPATH=python /usr/bin/python3 bench/torch_moe_bench.py [--rounds 7] [--parts dx,step]

Ratios are the peer's median time over gradkit's (>= 1.0: gradkit at least as fast) and
gradkit's peak memory over the peer's. Runs with OMP_WAIT_POLICY=PASSIVE and
OPENBLAS_THREAD_TIMEOUT=4 (restarts itself with them): libtorch's and gradkit's OpenMP threads,
and the threads of the OpenBLAS behind Debian's torch, otherwise keep spinning after their own
call and steal the cores from whoever runs next (the fused float32 d_x took 351 ms against 290 ms
when it ran right after torch's mm, which did not get faster for it: 343 against 332 ms).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

if os.environ.get("OMP_WAIT_POLICY") is None or os.environ.get("OPENBLAS_THREAD_TIMEOUT") is None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # 2^4 cycles of spinning, then sleep
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch  # noqa: E402

import gradkit.torch as gkt  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MIB = 1 << 20


def interleaved(candidates, rounds):
    """{name: median seconds}: every round runs each candidate once, in turn."""
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def s1_routing(args, gen):
    """expert_idx [batch, topk]: distinct experts per token, uniformly at random."""
    scores = torch.rand(args.batch, args.experts, generator=gen)
    return scores.topk(args.topk, dim=1).indices


# ---------------------------------------------------------------------------------------------
# (a) the fused d_x operator

def bench_dx(args, dtype):
    gen = torch.Generator().manual_seed(1)
    m = args.batch * args.topk
    x = torch.empty(args.batch, args.hidden, dtype=dtype)  # moe_route reads only its shape
    routing = gkt.moe_route(x, s1_routing(args, gen), args.experts)
    grad_y = torch.randn(m, args.ffn, generator=gen).to(dtype)
    weight = (torch.randn(args.experts, args.hidden, args.ffn, generator=gen) / 32).to(dtype)
    idx, groups = routing.expanded_row_idx, routing.group_list
    token = routing.token_of_row()
    bounds = torch.cumsum(groups, 0).tolist()
    starts = [0] + bounds[:-1]

    def fused():
        return gkt.ops.moe_init_routing_grouped_matmul_grad(
            grad_y, weight, idx, groups, args.batch, args.topk, gkt.ROW_IDX_GATHER,
            gkt.GROUP_LIST_COUNT)

    def composite():
        buf = torch.empty(m, args.hidden, dtype=dtype)  # the [M, H] intermediate
        for g, (s, e) in enumerate(zip(starts, bounds)):
            torch.mm(grad_y[s:e], weight[g].t(), out=buf[s:e])
        dx = torch.zeros(args.batch, args.hidden, dtype=torch.float32)
        return dx.index_add_(0, token, buf if dtype == torch.float32 else buf.float())

    def composite_mm_only():  # the composite's GEMMs alone: what the rest of it costs
        buf = torch.empty(m, args.hidden, dtype=dtype)
        for g, (s, e) in enumerate(zip(starts, bounds)):
            torch.mm(grad_y[s:e], weight[g].t(), out=buf[s:e])
        return buf

    a, b = fused(), composite()
    err = (a - b).abs().max().item() / b.abs().max().item()
    if err > (1e-5 if dtype == torch.float32 else 2e-2):
        raise SystemExit(f"dx {dtype}: gradkit and the composite differ (relative {err:.2e})")
    med = interleaved({"gradkit": fused, "torch": composite, "torch mm": composite_mm_only},
                      args.rounds)
    itemsize = torch.finfo(dtype).bits // 8
    avoided = m * args.hidden * itemsize + (0 if dtype == torch.float32 else m * args.hidden * 4)
    return med, avoided, err


# ---------------------------------------------------------------------------------------------
# (b) one training step of the layer

LAYERS = ("gradkit", "gradkit fused", "torch")  # fused: MoeFFN(grad_accumulation_fusion=True)


def make_layer(kind, args, dtype):
    torch.manual_seed(0)
    if kind == "torch":
        return gkt.TorchMoeFFN(args.hidden, args.ffn, args.experts, args.topk, "gelu", dtype=dtype)
    return gkt.MoeFFN(args.hidden, args.ffn, args.experts, args.topk, "gelu", dtype=dtype,
                      grad_accumulation_fusion=kind == "gradkit fused")


def bench_step(args, dtype):
    layers = {kind: make_layer(kind, args, dtype) for kind in LAYERS}
    for kind in LAYERS[1:]:
        layers[kind].load_state_dict(layers["gradkit"].state_dict())
    gen = torch.Generator().manual_seed(2)
    x0 = torch.randn(args.batch, args.hidden, generator=gen).to(dtype)
    dout = torch.randn(args.batch, args.hidden, generator=gen).to(dtype)
    xs = {kind: x0.clone().requires_grad_() for kind in LAYERS}

    def step(layer, x):
        def run():
            layer.zero_grad(set_to_none=False)
            x.grad = None
            layer(x).backward(dout)
        return run

    fns = {kind: step(layers[kind], xs[kind]) for kind in LAYERS}
    for fn in fns.values():
        fn()  # warm-up; also the parity check below
    ref_x, ref_layer = float32_reference(layers["gradkit"], x0, dout)
    errs = {kind: max(relative_error(a.grad, b.grad) for a, b in
                      ((xs[kind], ref_x), (layers[kind].w1, ref_layer.w1),
                       (layers[kind].w2, ref_layer.w2)))
            for kind in LAYERS}
    bound = 1e-4 if dtype == torch.float32 else 5e-2
    for kind in LAYERS[:2]:
        if errs[kind] > bound:
            raise SystemExit(f"step {dtype}: {kind}'s gradients differ from the float32 "
                             f"reference (relative {errs[kind]:.2e}; TorchMoeFFN "
                             f"{errs['torch']:.2e})")
    med = interleaved(fns, args.rounds)
    if args.profile:
        profile_step(fns, dtype)
    return med, errs


def relative_error(got, want):
    return (got.float() - want).abs().max().item() / want.abs().max().item()


def float32_reference(layer, x0, dout):
    """The gradients of the same layer in float32 (its parameters and x0 widened), with the
    experts the layer's own dtype chose, so that the rounding of the logits cannot change the
    routing: (x with its .grad, the float32 TorchMoeFFN with its parameters' .grad). Both layers
    are checked against it, not against each other: torch 1.13's bfloat16 mm on a CPU without
    AVX512-BF16 has been seen 12% off (relative to the largest value) on a 2048-deep product."""
    ref = gkt.TorchMoeFFN(layer.hidden, layer.ffn_hidden, layer.num_experts, layer.topk, "gelu")
    ref.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    with torch.no_grad():
        expert_idx = layer.gate(x0)[0]

    def gate(tokens):  # top_k_gating, with the experts fixed
        return expert_idx, torch.softmax(ref.router(tokens).gather(1, expert_idx), dim=-1)

    ref.gate = gate
    x = x0.float().requires_grad_()
    ref(x).backward(dout.float())
    return x, ref


def profile_step(fns, dtype):
    for name, fn in fns.items():
        with torch.autograd.profiler.profile() as prof:
            fn()
        print(f"\nprofile of one step, {name}, {dtype}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


# ---------------------------------------------------------------------------------------------
# (c) peak memory of one step, one process per layer

def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_probe(kind, args, dtype):
    layer = make_layer(kind, args, dtype)
    x = torch.randn(args.batch, args.hidden).to(dtype).requires_grad_()
    dout = torch.randn(args.batch, args.hidden).to(dtype)
    layer(x).backward(dout)  # warm-up: the gradients exist from here on
    if args.grads == "none":  # as optimizer.zero_grad() does by default since torch 2.0
        layer.zero_grad(set_to_none=True)
        x.grad = None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = _status_kib("VmRSS")
    layer(x).backward(dout)
    print(f"base_mib {base / 1024:.1f} peak_step_mib {(_status_kib('VmHWM') - base) / 1024:.1f}")


def measure_memory(args, dtype_name):
    env = dict(os.environ)
    # Large blocks from mmap and back to the system when freed: glibc would otherwise keep what
    # the warm-up step freed, and the measured step would reuse it without raising the RSS.
    env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    result = {}
    for kind in LAYERS:
        cmd = [sys.executable, os.path.abspath(__file__), "--memory-probe", kind,
               "--probe-dtype", dtype_name, "--threads", str(args.threads), "--grads", args.grads]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"memory probe {kind} {dtype_name} failed:\n{out.stderr}")
        fields = out.stdout.split()
        result[kind] = (float(fields[1]), float(fields[3]))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--parts", default="dx,step,memory")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--profile", action="store_true", help="print a profile of one step of each")
    p.add_argument("--grads", choices=("kept", "none"), default="kept",
                   help="memory: the measured step adds into the gradients of the step before "
                        "(kept: zero_grad(set_to_none=False), torch 1.13's default) or creates "
                        "them (none: set_to_none=True, the default since torch 2.0)")
    p.add_argument("--memory-probe", choices=LAYERS, help=argparse.SUPPRESS)
    p.add_argument("--probe-dtype", choices=tuple(DTYPES), default="fp32", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.batch, args.topk, args.experts, args.hidden, args.ffn = 4096, 2, 8, 2048, 1408
    torch.set_num_threads(args.threads)
    gkt.ops.set_num_threads(args.threads)
    if args.memory_probe:
        memory_probe(args.memory_probe, args, DTYPES[args.probe_dtype])
        return 0

    parts = args.parts.split(",")
    dtypes = args.dtypes.split(",")
    print(f"S1: batch {args.batch}, topK {args.topk}, {args.experts} experts, H {args.hidden}, "
          f"F {args.ffn} (M {args.batch * args.topk}); {args.threads} threads, {args.rounds} "
          f"rounds, medians; torch {torch.__version__}, gradkit {gkt.version()} "
          f"({gkt.ops.cpu_isa()}); load average {os.getloadavg()[0]:.1f}")
    if "dx" in parts:
        print("\n(a) d_x of an expert matmul: fused operator vs per-expert mm + index_add_")
        for name in dtypes:
            med, avoided, err = bench_dx(args, DTYPES[name])
            print(f"  {name}: gradkit {med['gradkit'] * 1e3:.1f} ms, torch composite "
                  f"{med['torch'] * 1e3:.1f} ms (its mm alone {med['torch mm'] * 1e3:.1f} ms), "
                  f"ratio {med['torch'] / med['gradkit']:.2f}x; "
                  f"intermediate avoided {avoided / MIB:.0f} MiB (max rel. diff {err:.1e})")
    if "step" in parts:
        print("\n(b) one training step (forward + backward): MoeFFN vs TorchMoeFFN")
        for name in dtypes:
            med, errs = bench_step(args, DTYPES[name])
            print(f"  {name}: MoeFFN {med['gradkit'] * 1e3:.0f} ms, fused "
                  f"{med['gradkit fused'] * 1e3:.0f} ms, TorchMoeFFN {med['torch'] * 1e3:.0f} ms, "
                  f"ratio {med['torch'] / med['gradkit']:.2f}x, fused "
                  f"{med['torch'] / med['gradkit fused']:.2f}x (max rel. grad diff from float32: "
                  f"MoeFFN {errs['gradkit']:.1e}, TorchMoeFFN {errs['torch']:.1e})")
    if "memory" in parts:
        print(f"\n(c) peak RSS increase of one step over the RSS before it (separate processes; "
              f"gradients {args.grads})")
        for name in dtypes:
            mem = measure_memory(args, name)
            print(f"  {name}: MoeFFN {mem['gradkit'][1]:.0f} MiB, fused "
                  f"{mem['gradkit fused'][1]:.0f} MiB, TorchMoeFFN {mem['torch'][1]:.0f} MiB, "
                  f"ratio {mem['gradkit'][1] / mem['torch'][1]:.2f}, fused "
                  f"{mem['gradkit fused'][1] / mem['torch'][1]:.2f} (RSS before the step: "
                  f"{mem['gradkit'][0]:.0f} / {mem['gradkit fused'][0]:.0f} / "
                  f"{mem['torch'][0]:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
