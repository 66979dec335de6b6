"""What the DDP stop agreement costs per training step; prints a markdown table.

Under DDP, ``StopCheckpoint`` (srupp_asr/train.py) makes the ranks agree at every training step's end whether
any of them received SIGTERM or Ctrl-C: Lightning's ``strategy.reduce_boolean_decision``, one all-reduce of a
one-element tensor. This times exactly that call in ``--world-size`` processes (gloo on the CPU; NCCL with
``--device cuda``, one GPU per process), the median of ``--repeats`` calls after ``--warmup`` untimed ones,
beside an all-reduce of ``--grad-mib`` MiB (a stand-in for one step's gradient all-reduce), so the cost reads
against what every DDP step already pays.

    python benchmarks/stop_agreement_cost.py                          # 2 CPU processes, gloo
    python benchmarks/stop_agreement_cost.py --device cuda --world-size 8
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from recurrence_speed import _cpu_name  # this folder is on sys.path when a script here runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, repeats: int, warmup: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls, every rank starting each call together."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank: int, args: argparse.Namespace, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.world_size)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")

    def agree() -> bool:
        # what Lightning's DDPStrategy.reduce_boolean_decision(decision, all=False) does
        decision = torch.tensor(int(rank == 0), device=device)
        dist.all_reduce(decision, op=dist.ReduceOp.SUM)
        return bool(decision > 0)

    grads = torch.ones(int(args.grad_mib * 2**20 / 4), device=device)
    flag = _timed(agree, args.repeats, args.warmup, device)
    grad = _timed(lambda: dist.all_reduce(grads), args.repeats, args.warmup, device)
    if rank == 0:
        results.put((flag, grad))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    """Time the agreement and the gradient-sized all-reduce in a process group; print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--grad-mib", type=float, default=12.0, help="size of the stand-in gradient all-reduce")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        raise SystemExit(f"--device cuda needs {args.world_size} GPUs, found {torch.cuda.device_count()}")
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_worker, args=(args, _free_port(), results), nprocs=args.world_size, join=True)
    flag, grad = results.get()
    backend = "nccl" if args.device == "cuda" else "gloo"
    where = torch.cuda.get_device_name() if args.device == "cuda" else _cpu_name()
    print(f"machine: {where}, {args.world_size} processes, {backend}, torch {torch.__version__}")
    print(f"median of {args.repeats} calls after {args.warmup} untimed\n")
    print("| all-reduce | median µs |")
    print("|---|---|")
    print(f"| stop agreement (one flag, each step) | {flag * 1e6:.0f} |")
    print(f"| {args.grad_mib:g} MiB of float32 (a step's gradients) | {grad * 1e6:.0f} |")


if __name__ == "__main__":
    main()
