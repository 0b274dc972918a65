#!/usr/bin/python3
"""gradkit's MoE FFN with its experts split over processes (expert parallelism), checked against
the single-process MoeFFN on the full batch.

Each of the WORLD ranks owns G / WORLD experts (its slices of w1 and w2), a copy of the router
and its own share of the tokens. One step of the layer on a rank:

  1. route:    top-k gating of its tokens; each kept (token, expert) slot is destined for the rank
               that owns the expert. gradkit's moe_route, with the ranks as the "experts", groups
               the slots by destination rank (in slot order) and counts them.
  2. dispatch: the tokens' rows, in that order, go to their owners with all_to_all_single (the
               list form all_to_all does not work on gloo in torch 1.13), with each row's expert.
  3. experts:  the owner runs its experts on the rows it received, with gradkit's autograd ops
               (moe_grouped_linear -> activation -> moe_expert_linear, then moe_combine with
               weight 1 to bring the rows back to the order they arrived in).
  4. return:   the results go back by the reverse all_to_all_single.
  5. combine:  gradkit's moe_combine weights each slot's row by its gating probability and sums
               a token's slots.

The exchange is an autograd Function whose backward is the reverse all_to_all_single, so
loss.backward() sends the gradients of the returned rows to the owners and the gradients of the
dispatched rows back to the tokens' ranks. The router is replicated: its gradient is all-reduced
(summed) over the ranks, as data parallelism does.

The check: each rank's output, its tokens' input gradient, the all-reduced router gradient and
its experts' w1 and w2 gradients equal the single-process MoeFFN's on the full batch (float32
tolerance); the maximum differences are printed, and the exit status is 1 when any is out.

On GPUs the same exchange code runs with NCCL (backend "nccl", CUDA tensors, one GPU per rank):
nothing in the routing, the exchange or its autograd is specific to gloo or to the CPU. gradkit's
operators are CPU-only, though, so there the experts of step 3 must run on a GPU implementation
(e.g. TorchMoeFFN's per-expert matmuls); this script runs gloo on the CPU.

    PYTHONPATH=python /usr/bin/python3 examples/expert_parallel.py     # from the repository root
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradkit.torch as gkt

WORLD = 2


class _Exchange(torch.autograd.Function):
    """all_to_all_single of rows: send_counts[r] rows go to rank r, recv_counts[r] come from it."""

    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts):
        ctx.counts = (send_counts, recv_counts)
        out = rows.new_empty((sum(recv_counts), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), recv_counts, send_counts)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        send_counts, recv_counts = ctx.counts
        grad = grad_out.new_empty((sum(send_counts), *grad_out.shape[1:]))
        dist.all_to_all_single(grad, grad_out.contiguous(), send_counts, recv_counts)
        return grad, None, None


def exchange(rows, send_counts, recv_counts):
    return _Exchange.apply(rows, send_counts, recv_counts)


class ExpertParallelMoeFFN(torch.nn.Module):
    """This rank's part of an MoeFFN: the router (replicated) and experts [first, first + local)."""

    def __init__(self, full, rank, world):
        super().__init__()
        if full.num_experts % world:
            raise ValueError(f"num_experts is {full.num_experts}; it must be a multiple of the "
                             f"world size {world}")
        if full.capacity:
            raise ValueError("capacity drops are not split over ranks here; use capacity 0")
        self.rank, self.world = rank, world
        self.topk, self.activation = full.topk, full.activation
        self.local = full.num_experts // world
        first = rank * self.local
        self.router = torch.nn.Linear(full.hidden, full.num_experts, bias=False)
        self.router.load_state_dict(full.router.state_dict())
        self.w1 = torch.nn.Parameter(full.w1.detach()[first:first + self.local].clone())
        self.w2 = torch.nn.Parameter(full.w2.detach()[first:first + self.local].clone())

    def forward(self, x):
        # 1. route: slots grouped by the rank that owns their expert.
        expert_idx, probs = gkt.top_k_gating(self.router(x), self.topk)
        owner = torch.div(expert_idx, self.local, rounding_mode="floor")
        to_ranks = gkt.moe_route(x, owner, self.world)
        send_counts = to_ranks.group_list.tolist()
        recv = torch.empty(self.world, dtype=torch.int64)
        dist.all_to_all_single(recv, to_ranks.group_list)
        recv_counts = recv.tolist()

        # 2. dispatch: each slot's token row and its expert (numbered on the owner).
        rows = x.index_select(0, to_ranks.token_of_row())
        local_expert = (expert_idx % self.local).reshape(-1)[to_ranks.expanded_row_idx]
        arrived = exchange(rows, send_counts, recv_counts)
        arrived_expert = torch.empty(sum(recv_counts), dtype=torch.int64)
        dist.all_to_all_single(arrived_expert, local_expert, recv_counts, send_counts)

        # 3. experts: each arrived row is a token with one slot (topk 1) on the local experts.
        h, routing = gkt.moe_grouped_linear(arrived, arrived_expert.unsqueeze(1), self.w1)
        y = gkt.moe_expert_linear(self.activation(h), routing, self.w2)
        ones = torch.ones(arrived.shape[0], 1, dtype=y.dtype)
        done = gkt.moe_combine(y, ones, routing)  # back in arrival order

        # 4. return, 5. combine: row i of `back` is slot to_ranks.expanded_row_idx[i].
        back = exchange(done, recv_counts, send_counts)
        return gkt.moe_combine(back, probs.to(back.dtype), to_ranks)


def max_diff(a, b):
    return (a - b).abs().max().item()


def close(a, b, rtol):
    """|a - b| <= rtol * max|b| everywhere: float32 summation orders differ between the runs."""
    return max_diff(a, b) <= rtol * b.abs().max().item()


def worker(rank, world, init_file, args):
    torch.set_num_threads(1)   # the ranks share the machine's cores
    gkt.ops.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)

    # The full layer and batch, the same on every rank (same seed): the reference.
    torch.manual_seed(args.seed)
    full = gkt.MoeFFN(args.hidden, args.ffn, args.experts, args.topk, "gelu")
    x_all = torch.randn(args.batch, args.hidden)
    dout_all = torch.randn(args.batch, args.hidden)
    x_ref = x_all.clone().requires_grad_()
    out_ref = full(x_ref)
    out_ref.backward(dout_all)

    # This rank's tokens and experts.
    share = args.batch // world
    mine = slice(rank * share, (rank + 1) * share)
    layer = ExpertParallelMoeFFN(full, rank, world)
    x = x_all[mine].clone().requires_grad_()
    out = layer(x)
    out.backward(dout_all[mine])
    dist.all_reduce(layer.router.weight.grad)  # the replicated router: sum over the ranks

    first = rank * layer.local
    experts = slice(first, first + layer.local)
    checks = [
        ("output", out, out_ref[mine]),
        ("grad x", x.grad, x_ref.grad[mine]),
        ("grad router", layer.router.weight.grad, full.router.weight.grad),
        ("grad w1 (own experts)", layer.w1.grad, full.w1.grad[experts]),
        ("grad w2 (own experts)", layer.w2.grad, full.w2.grad[experts]),
    ]
    diffs = torch.tensor([max_diff(a, b) for _, a, b in checks], dtype=torch.float64)
    ok = torch.tensor([float(close(a, b, args.rtol)) for _, a, b in checks], dtype=torch.float64)
    scale = torch.tensor([b.abs().max().item() for _, _, b in checks], dtype=torch.float64)
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    dist.all_reduce(scale, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"{world} ranks (gloo), {args.experts} experts ({layer.local} per rank), "
              f"top-{args.topk}, batch {args.batch} ({share} tokens per rank), H {args.hidden}, "
              f"F {args.ffn}, float32")
        print("max |expert-parallel - single-process| over the ranks "
              f"(allowed: {args.rtol:g} x max|single-process|):")
        for (name, _, _), d, s, good in zip(checks, diffs.tolist(), scale.tolist(), ok.tolist()):
            print(f"  {name:<22} {d:.3e}  (max|ref| {s:.3e})  {'ok' if good else 'OUT'}")
        print("OK" if bool(ok.min()) else "FAILED")
    dist.barrier()
    dist.destroy_process_group()
    if not bool(ok.min()):
        sys.exit(1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=512, help="tokens over all ranks")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=1e-5,
                   help="allowed max difference, relative to the reference's largest magnitude")
    args = p.parse_args(argv)
    if args.batch % WORLD or args.experts % WORLD:
        p.error(f"--batch is {args.batch} and --experts {args.experts}; both must be multiples "
                f"of the {WORLD} ranks")
    return args


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(worker, args=(WORLD, os.path.join(tmp, "rendezvous"), args), nprocs=WORLD)
        except mp.ProcessExitedException as e:
            print(f"FAILED: rank {e.error_index} exited with status {e.exit_code}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
