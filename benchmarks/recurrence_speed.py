"""Speed of the SRU recurrence against its peers, measured in the same run; prints markdown tables.

CPU (always): batch 8, 1000 steps, hidden 512 per direction, bidirectional (1024 columns), against
``torch.nn.LSTM`` of the same hidden size and against a plain per-step PyTorch loop of the same
recurrence. GPU (when CUDA and CuPy are present): batch 32, 1000 steps, hidden 1024 per direction,
fp32 and bf16, as effective bandwidth (bytes the kernel must read and write / time) against a
device-to-device copy, and against cuDNN ``nn.LSTM``.

    python benchmarks/recurrence_speed.py [--repeats 5] [--threads 2] [--skip-gpu]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from srupp_asr import kernels
from srupp_asr.recurrence import sru_recurrence, sru_recurrence_loop
from srupp_asr.sru import SRUppLayer


def _time_cpu(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up (builds the extension, fills caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _time_cuda(fn: Callable[[], None], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def _recurrence_inputs(L: int, B: int, D: int, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(L, B, D, 3), (L, B, D), (2, D), (2, D)]
    return [(torch.randn(s, generator=g) * 0.5).to(device, dtype).requires_grad_() for s in shapes]


def _fwd(run: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def go() -> None:
        with torch.no_grad():
            run()

    return go


def _fwd_bwd(run: Callable[[], torch.Tensor], inputs: list[torch.Tensor]) -> Callable[[], None]:
    # autograd.grad, not backward(): gradients are not accumulated into .grad between repeats. The incoming
    # gradient is made once, outside the timing (a fresh 32 MB tensor costs ~9 ms of page faults on this CPU,
    # which is the caller's allocation, not the recurrence's work).
    grad: list[torch.Tensor] = []

    def go() -> None:
        out = run()
        if not grad:
            grad.append(torch.ones_like(out))
        torch.autograd.grad(out, inputs, grad[0])

    return go


# The same recurrence with the CPU extension's output pool off (it is on by default: $SRUPP_CPU_POOL_MB, see
# sru_cpu.cpp), so its outputs are fresh memory at every call.
UNPOOLED = "SRU recurrence, output pool off (SRUPP_CPU_POOL_MB=0)"


def cpu_table(repeats: int) -> list[tuple[str, float, float]]:
    """(name, forward s, forward+backward s) on the CPU."""
    L, B, d = 1000, 8, 512
    D = 2 * d
    u, x, wc, bias = _recurrence_inputs(L, B, D, "cpu", torch.float32)
    lstm = torch.nn.LSTM(D, d, bidirectional=True)
    layer = SRUppLayer(D, 256, num_heads=4, attention=False)
    layer_attn = SRUppLayer(D, 256, num_heads=4, attention=True)
    x_layer = x.detach().clone().requires_grad_()
    runs = {
        "SRU recurrence (srupp-asr, C++)": (
            lambda: sru_recurrence(u, x, wc, bias, bidirectional=True)[0],
            [u, x, wc, bias],
        ),
        UNPOOLED: (lambda: sru_recurrence(u, x, wc, bias, bidirectional=True)[0], [u, x, wc, bias]),
        "SRU recurrence, per-step PyTorch loop": (
            lambda: sru_recurrence_loop(u, x, wc, bias, bidirectional=True)[0],
            [u, x, wc, bias],
        ),
        "torch.nn.LSTM (same hidden size)": (lambda: lstm(x)[0], [x, *lstm.parameters()]),
        "SRU++ layer, no attention (d'=256)": (lambda: layer(x_layer)[0], [x_layer, *layer.parameters()]),
        "SRU++ layer, attention (d'=256, 4 heads)": (
            lambda: layer_attn(x_layer)[0],
            [x_layer, *layer_attn.parameters()],
        ),
    }
    rows = []
    ext = kernels.cpu_extension()
    for name, (run, inputs) in runs.items():
        n = max(1, repeats // 2) if "loop" in name else repeats
        limit = ext.pool_stats()[0]
        if name == UNPOOLED:
            ext.set_pool_limit(0)
        try:
            rows.append((name, _time_cpu(_fwd(run), n), _time_cpu(_fwd_bwd(run, inputs), n)))
        finally:
            ext.set_pool_limit(limit)
    return rows


def gpu_table(repeats: int, variants: list[tuple[int, int]]) -> list[str]:
    """Markdown rows of the GPU comparison, one set per kernel variant ``(columns per thread, chunk)``."""
    L, B, d = 1000, 32, 1024
    D = 2 * d
    lines = []
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    t_copy = _time_cuda(lambda: dst.copy_(big), repeats)
    copy_bw = 2 * big.numel() / t_copy
    lines.append(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    lines.append("")
    lines.append(
        "| dtype | columns / thread | chunk | pass | time ms | bytes moved | GB/s | % of copy | cuDNN LSTM ms "
        "| LSTM / SRU |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        u, x, wc, bias = _recurrence_inputs(L, B, D, "cuda", dtype)
        lstm = torch.nn.LSTM(D, d, bidirectional=True).to("cuda", dtype)
        es, n = torch.tensor([], dtype=dtype).element_size(), L * B * D
        # the training forward (inputs need grad): read u, x; write h (dtype) and the states (fp32)
        fwd_bytes = n * (3 * es + es + es + 4)
        bwd_bytes = n * (3 * es + es + 4 + es + 3 * es + es)  # read u, x, states, grad_h; write grad_u, grad_x
        t_lstm_fwd = _time_cuda(lambda lstm=lstm, x=x: lstm(x), repeats)
        t_lstm_fb = _time_cuda(_fwd_bwd(lambda lstm=lstm, x=x: lstm(x)[0], [x, *lstm.parameters()]), repeats)
        for cols, chunk in variants:
            with _cuda_variant(cols, chunk):
                t_fwd = _time_cuda(
                    lambda u=u, x=x, wc=wc, bias=bias: sru_recurrence(u, x, wc, bias, bidirectional=True), repeats
                )
                h, _ = sru_recurrence(u, x, wc, bias, bidirectional=True)
                grad = torch.randn_like(h)

                def backward(h=h, grad=grad, inputs=(u, x, wc, bias)) -> None:
                    torch.autograd.grad(h, inputs, grad, retain_graph=True)

                t_bwd = _time_cuda(backward, repeats)
            name = str(dtype).replace("torch.", "")
            for what, t, nbytes, t_lstm in (
                ("forward", t_fwd, fwd_bytes, t_lstm_fwd),
                ("backward", t_bwd, bwd_bytes, None),
                ("forward+backward", t_fwd + t_bwd, fwd_bytes + bwd_bytes, t_lstm_fb),
            ):
                bw = nbytes / t
                lstm_cells = "- | -" if t_lstm is None else f"{t_lstm * 1e3:.2f} | {t_lstm / t:.1f}x"
                lines.append(
                    f"| {name} | {cols} | {chunk} | {what} | {t * 1e3:.2f} | {nbytes / 1e6:.0f} MB | "
                    f"{bw / 1e9:.0f} | {100 * bw / copy_bw:.0f}% | {lstm_cells} |"
                )
    return lines


@contextlib.contextmanager
def _cuda_variant(cols: int, chunk: int):
    """Select the CUDA kernel variant through its environment variables for the duration of the block."""
    saved = {k: os.environ.get(k) for k in ("SRUPP_CUDA_COLS", "SRUPP_CUDA_CHUNK")}
    os.environ.update(SRUPP_CUDA_COLS=str(cols), SRUPP_CUDA_CHUNK=str(chunk))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> None:
    """Run the benchmarks and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--skip-gpu", action="store_true")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument(
        "--gpu-variants",
        default="1x4,2x4,4x4",
        help="CUDA kernel variants to time, as COLUMNS_PER_THREAD x CHUNK (default: 1x4,2x4,4x4)",
    )
    args = parser.parse_args()
    variants = parse_variants(args.gpu_variants)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {_cpu_name()}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}")
    if not args.skip_cpu:
        _print_cpu_table(args.repeats)
    if args.skip_gpu or not torch.cuda.is_available():
        print("\nGPU: skipped (no CUDA device)" if not args.skip_gpu else "\nGPU: skipped")
        return
    print(f"\nGPU: {torch.cuda.get_device_name()}, B=32, L=1000, hidden 1024 per direction, bidirectional;")
    print("forward as in training: the states are kept for backward\n")
    for line in gpu_table(args.repeats, variants):
        print(line)


def parse_variants(text: str) -> list[tuple[int, int]]:
    """``"1x4,2x4"`` -> ``[(1, 4), (2, 4)]`` (columns per thread, chunk); exits with a one-line error otherwise."""
    variants = []
    for item in text.split(","):
        cols, _, chunk = item.strip().partition("x")
        if not (cols.isdigit() and chunk.isdigit()) or int(cols) not in kernels.CUDA_COLUMN_CHOICES:
            raise SystemExit(
                f"--gpu-variants: {item!r} is not COLUMNS x CHUNK with COLUMNS in {kernels.CUDA_COLUMN_CHOICES}"
            )
        if not 1 <= int(chunk) <= 64:
            raise SystemExit(f"--gpu-variants: chunk {chunk} is not in 1..64")
        variants.append((int(cols), int(chunk)))
    return variants


def cpu_copy_bandwidth(repeats: int) -> float:
    """Bytes per second (read + write) of a 256 MiB copy between two tensors allocated beforehand."""
    src = torch.ones(64 * 2**20)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _time_cpu(lambda: dst.copy_(src), repeats)


def _print_cpu_table(repeats: int) -> None:
    print("\nCPU: B=8, L=1000, hidden 512 per direction, bidirectional, fp32 (median seconds)\n")
    rows = cpu_table(repeats)
    ref_f, ref_fb = rows[0][1], rows[0][2]
    print("| implementation | forward s | fwd+bwd s | forward vs SRU | fwd+bwd vs SRU |")
    print("|---|---|---|---|---|")
    for name, f, fb in rows:
        print(f"| {name} | {f:.4f} | {fb:.4f} | {f / ref_f:.1f}x | {fb / ref_fb:.1f}x |")
    # The least time any implementation needs: moving the bytes the pass must read and write at the
    # measured copy bandwidth (no arithmetic, no page faults on fresh outputs), against the per-step loop.
    bw = cpu_copy_bandwidth(repeats)
    n = 1000 * 8 * 1024 * 4  # bytes of one (L, B, D) fp32 tensor
    fwd_bytes = 5 * n  # inference: read u (3n), x; write h
    # training forward: + the states; backward: read u, x, states, grad_h; write grad_u, grad_x
    fb_bytes = 6 * n + 10 * n
    loop_f, loop_fb = next((f, fb) for name, f, fb in rows if "per-step PyTorch loop" in name)
    print(f"\ncopy bandwidth {bw / 1e9:.1f} GB/s (read + write, 256 MiB, buffers allocated beforehand)\n")
    # The arithmetic alone: the same recurrence on 50 steps, whose inputs stay in the cache, times 20.
    f_cache, fb_cache = cache_resident_times(repeats)
    print(
        "| pass | bytes moved | least time s | SRU at % of that | largest possible speed-up over the loop "
        "| arithmetic alone s (inputs in cache) |"
    )
    print("|---|---|---|---|---|---|")
    for what, nbytes, t_sru, t_loop, t_cache in (
        ("forward", fwd_bytes, ref_f, loop_f, f_cache),
        ("fwd+bwd", fb_bytes, ref_fb, loop_fb, fb_cache),
    ):
        least = nbytes / bw
        print(
            f"| {what} | {nbytes / 1e6:.0f} MB | {least:.4f} | {100 * least / t_sru:.0f}% | {t_loop / least:.1f}x "
            f"| {t_cache:.4f} |"
        )


def cache_resident_times(repeats: int, steps: int = 50) -> tuple[float, float]:
    """Forward and forward+backward seconds of the CPU table's recurrence scaled to 1000 steps, measured on
    ``steps`` steps (about 3 MB of inputs, which stay in the cache between the 1000 / steps repeats)."""
    u, x, wc, bias = _recurrence_inputs(steps, 8, 1024, "cpu", torch.float32)
    reps = 1000 // steps

    def run() -> torch.Tensor:
        return sru_recurrence(u, x, wc, bias, bidirectional=True)[0]

    fwd, fwd_bwd = _fwd(run), _fwd_bwd(run, [u, x, wc, bias])
    t_f = _time_cpu(lambda: [fwd() for _ in range(reps)], repeats)
    t_fb = _time_cpu(lambda: [fwd_bwd() for _ in range(reps)], repeats)
    return t_f, t_fb


if __name__ == "__main__":
    main()
