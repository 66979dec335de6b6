"""Training throughput of the full ASR model, SRU++ against Conformer and BLSTM at matched size; prints markdown.

One training step is what ``ASRLightningModule`` runs for a batch, timed without the Trainer around it:
the whole :class:`~srupp_asr.model.ASRModel` (Fbank, CMVN, SpecAugment, Conv2d subsampling, encoder, CTC
head and attention decoder, loss 0.3 CTC + 0.7 label-smoothed CE) forward, backward, gradient clipping
at 5.0 (the configs' ``gradient_clip_val``) and an Adam step (the learning-rate schedule, one scalar per
step, is left out), under bf16 autocast with ``--precision bf16`` (Lightning's ``bf16-mixed``; on a CPU
without native bf16 that is slower than fp32). Throughput is seconds of (unpadded) audio per second of
wall time, from the median step time after ``--warmup-steps`` untimed steps.

Every encoder trains on the same synthetic batch: Gaussian noise utterances with durations drawn
uniformly from ``--utt-seconds LO HI`` until ``--batch-seconds`` is filled, random token targets
(``TOKENS_PER_SECOND`` per second of audio, a ``VOCAB_SIZE``-piece vocabulary), CMVN stats taken from the
batch itself. The models share the frontend, subsampling and decoder of ``--size``; each encoder keeps
the shape of its preset (``conf/train_*.yaml`` for ``small``) and one width is searched so that the
parameter counts match a target (``--target-params``, by default the SRU++ preset's count) on the
whole model (``--match total``) or the encoder alone (``--match encoder``): SRU++ ``d_model`` (the
recurrent width), Conformer ``ffn_dim`` (ESPnet keeps the attention width at the subsampling's),
BLSTM ``d_model``. The run stops before timing if the matched counts spread by more than 10%.

Each encoder runs in a fresh process, so neither memory nor allocator state carries over. Peak
memory: on CUDA ``torch.cuda.max_memory_allocated`` minus what was allocated before the model was
built (weights, gradients, Adam state, activations; not the caching allocator's reserve); on the CPU
the growth of the process's peak resident set size (``getrusage`` ``ru_maxrss``) from before the model
was built, which also counts memory the allocator keeps after freeing it.

    python benchmarks/train_throughput.py --size ci                          # ~1-2 min on 2 CPU cores
    python benchmarks/train_throughput.py --size small --device cuda --precision bf16
    python benchmarks/train_throughput.py --size large --device cuda --precision bf16   # ~100 M parameters

``--batches K`` trains on K batches of different shapes in turn (seeds 0..K-1: the utterances, so the rows and
lengths, differ as a sampler's batches do) instead of one; audio s / s is then the timed steps' audio over their
total time. ``--cuda-graphs`` (CUDA) adds a row: SRU++ again (after its eager row, on the same batches) with the
losses of :class:`srupp_asr.graphs.GraphedLosses`: each batch padded to ``--buckets SECONDS TOKENS ROWS``, the
forward and backward of each padded shape recorded in a CUDA graph in its first step and replayed after, so the
warm-up steps must cover every batch once (``--warmup-steps`` at least K). ``--shapes-only`` prints what padding
the batches to the buckets costs and how many graphs they need, without timing (on any machine).

``--compile`` runs the model under ``torch.compile`` (the recurrence, CTC and the encoder's padding check between
its graphs; compiled in the first warm-up step, so give at least one). ``--profile N`` adds a torch.profiler table
of N more steps with, per step, the device time, the host syncs (CUDA), and the aten operator calls (a proxy for
kernel launches, and the only count on a CPU).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import platform
import resource
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.decoder import IGNORE_ID
from srupp_asr.encoders import ENCODER_NAMES, encoder_num_params
from srupp_asr.graphs import GraphedLosses, ShapeBuckets
from srupp_asr.model import SOS_EOS_ID, ASRModel
from srupp_asr.schedulers import build_optimizer

VOCAB_SIZE = 500
TOKENS_PER_SECOND = 4.0  # about LibriSpeech's rate with 500 BPE pieces (2.7 words/s, 1.5 pieces/word)
GRAD_CLIP = 5.0  # conf/train_*.yaml: trainer.gradient_clip_val
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-6
MAX_SPREAD = 0.10  # largest allowed (max - min) / min of the matched parameter counts
SEED = 0

# The width searched per encoder, and its granularity (multiples of 8 keep GPU matrix shapes efficient).
WIDTH_KNOBS: dict[str, tuple[str, int]] = {
    "srupp": ("d_model", 16),
    "conformer": ("ffn_dim", 8),
    "blstm": ("d_model", 16),
}


@dataclass(frozen=True)
class Size:
    """A benchmark size: the shared network parts, each encoder's preset and the default run shape."""

    d_model: int  # subsampling width (the Conformer's attention width)
    decoder_conf: dict[str, Any]
    encoders: dict[str, dict[str, Any]]
    batch_seconds: float
    utt_seconds: tuple[float, float]
    steps: int
    warmup_steps: int
    specaugment: dict[str, Any] = field(default_factory=dict)  # SpecAugment's defaults, as in the configs


SIZES: dict[str, Size] = {
    # Small enough for the whole run (three encoders) to take a minute or two on 2 CPU cores.
    "ci": Size(
        d_model=128,
        decoder_conf={"d_model": 128, "num_layers": 2, "num_heads": 4, "ffn_dim": 512, "dropout": 0.1},
        encoders={
            "srupp": {"d_model": 512, "num_layers": 4, "attn_dim": 128, "num_heads": 4, "attn_every": 2},
            "conformer": {"num_layers": 4, "num_heads": 4, "ffn_dim": 512, "depthwise_conv_kernel_size": 15},
            "blstm": {"d_model": 512, "num_layers": 2},
        },
        batch_seconds=16.0,
        utt_seconds=(2.0, 6.0),
        steps=4,
        warmup_steps=1,
    ),
    # conf/train_srupp.yaml, conf/train_conformer.yaml, conf/train_blstm.yaml (about 28-40 M as configured).
    "small": Size(
        d_model=256,
        decoder_conf={"d_model": 256, "num_layers": 6, "num_heads": 4, "ffn_dim": 2048, "dropout": 0.1},
        encoders={
            "srupp": {"d_model": 1024, "num_layers": 12, "attn_dim": 256, "num_heads": 4, "attn_every": 2},
            "conformer": {"num_layers": 12, "num_heads": 4, "ffn_dim": 1024, "depthwise_conv_kernel_size": 31},
            "blstm": {"d_model": 1024, "num_layers": 4},
        },
        batch_seconds=200.0,  # the configs' data.max_duration (per GPU)
        utt_seconds=(10.0, 15.0),  # around LibriSpeech's mean training utterance (12.3 s)
        steps=20,
        warmup_steps=5,
    ),
    # ESPnet's LibriSpeech Conformer shape (12 x 512, 8 heads, 6 x 512 decoder): about 100 M parameters.
    "large": Size(
        d_model=512,
        decoder_conf={"d_model": 512, "num_layers": 6, "num_heads": 8, "ffn_dim": 2048, "dropout": 0.1},
        encoders={
            "srupp": {"d_model": 2048, "num_layers": 12, "attn_dim": 512, "num_heads": 8, "attn_every": 2},
            "conformer": {"num_layers": 12, "num_heads": 8, "ffn_dim": 2048, "depthwise_conv_kernel_size": 31},
            "blstm": {"d_model": 2048, "num_layers": 4},
        },
        batch_seconds=200.0,
        utt_seconds=(10.0, 15.0),
        steps=20,
        warmup_steps=5,
    ),
}


def model_kwargs(size: Size, encoder: str, encoder_conf: dict[str, Any]) -> dict[str, Any]:
    """ASRModel keyword arguments for ``encoder`` with ``encoder_conf`` inside ``size``'s shared parts."""
    return {
        "vocab_size": VOCAB_SIZE,
        "d_model": size.d_model,
        "encoder": encoder,
        "encoder_conf": {"dropout": 0.1, **encoder_conf},
        "decoder_conf": size.decoder_conf,
        "specaugment": size.specaugment,
    }


def count_params(kwargs: dict[str, Any]) -> tuple[int, int]:
    """(whole model, encoder) parameter counts of ``ASRModel(**kwargs)``, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = ASRModel(**kwargs)
    return model.num_params(), encoder_num_params(model.encoder)


def match_width(size: Size, encoder: str, target: int, match: str) -> dict[str, Any]:
    """The encoder's preset with its width knob set so the ``match`` count ("total"/"encoder") is nearest ``target``."""
    key, step = WIDTH_KNOBS[encoder]
    preset = size.encoders[encoder]
    which = 0 if match == "total" else 1

    def count(units: int) -> int:
        return count_params(model_kwargs(size, encoder, {**preset, key: units * step}))[which]

    low, high = 1, 1  # smallest number of units with count >= target lies in (low, high]
    while count(high) < target:
        low, high = high, high * 2
        if high > 2**16:
            raise SystemExit(f"error: {encoder} cannot reach {target:,} parameters by widening {key}")
    if count(low) >= target:
        high = low
    while high - low > 1:
        mid = (low + high) // 2
        if count(mid) >= target:
            high = mid
        else:
            low = mid
    best = min((low, high), key=lambda units: abs(count(units) - target))
    if abs(count(best) - target) > MAX_SPREAD * target:
        raise SystemExit(f"error: {encoder} has {count(best):,} {match} parameters at best, not {target:,} (+-10%)")
    return {**preset, key: best * step}


def synthetic_batch(
    batch_seconds: float, utt_seconds: tuple[float, float], seed: int = SEED
) -> dict[str, torch.Tensor]:
    """A padded batch of noise utterances filling ``batch_seconds`` and random targets, the same for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    low, high = utt_seconds
    durations: list[float] = []
    while True:
        seconds = low + (high - low) * float(torch.rand((), generator=gen))
        if durations and sum(durations) + seconds > batch_seconds:
            break
        durations.append(seconds)
    samples = torch.tensor([round(d * SAMPLE_RATE) for d in durations])
    audio = 0.1 * torch.randn(len(durations), int(samples.max()), generator=gen)
    audio = audio.masked_fill(torch.arange(audio.size(1)) >= samples[:, None], 0.0)
    token_lens = torch.tensor([max(1, round(d * TOKENS_PER_SECOND)) for d in durations])
    tokens = torch.randint(SOS_EOS_ID + 1, VOCAB_SIZE, (len(durations), int(token_lens.max())), generator=gen)
    tokens = tokens.masked_fill(torch.arange(tokens.size(1)) >= token_lens[:, None], IGNORE_ID)
    return {"audio": audio, "audio_lens": samples, "tokens": tokens, "token_lens": token_lens}


def synthetic_batches(batch_seconds: float, utt_seconds: tuple[float, float], count: int) -> list[dict]:
    """``count`` :func:`synthetic_batch` es, seeds ``SEED``, ``SEED + 1``, ...: their shapes vary as a sampler's do."""
    return [synthetic_batch(batch_seconds, utt_seconds, SEED + i) for i in range(count)]


def bucket_padding(batches: list[dict], buckets: ShapeBuckets) -> list[str]:
    """What padding ``batches`` to ``buckets`` (as :class:`~srupp_asr.graphs.GraphedLosses` does) costs: a table of
    their audio, the eager step's padded batches, the same padded to the buckets, and the distinct padded shapes (the
    graphs a run records)."""
    audio = sum(float(b["audio_lens"].sum()) for b in batches) / SAMPLE_RATE
    eager = sum(b["audio"].numel() for b in batches) / SAMPLE_RATE
    shapes = [buckets.shape(b["audio"].size(0), b["audio"].size(1), b["tokens"].size(1)) for b in batches]
    bucketed = sum(rows * samples for rows, samples, _ in shapes) / SAMPLE_RATE
    return [
        f"| batches | audio | eager padded | padded to the buckets ({buckets.seconds:g} s, {buckets.tokens} tokens, "
        f"{buckets.rows} rows) | shapes (graphs) |",
        "|---|---|---|---|---|",
        f"| {len(batches)} | {audio:,.0f} s | {eager:,.0f} s | {bucketed:,.0f} s ({bucketed / eager - 1:+.0%}) | "
        f"{len(set(shapes))} |",
    ]


def _peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Train ``job``'s model for its warm-up and timed steps; step times (s), peak memory (bytes), final loss."""
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    torch.manual_seed(SEED)
    device = torch.device(job["device"])
    # As in training (ASRLightningModule.transfer_batch_to_device): the lengths stay on the host, so the step never
    # waits for the device to read them.
    batches = [
        {k: v if k in ("audio_lens", "token_lens") else v.to(device) for k, v in batch.items()}
        for batch in synthetic_batches(job["batch_seconds"], job["utt_seconds"], job.get("batches", 1))
    ]
    batch = batches[0]
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        memory_before = torch.cuda.memory_allocated(device)
    else:
        memory_before = _peak_rss_bytes()
    model = ASRModel(**job["model"]).to(device)
    with torch.no_grad():  # normalise with the batch's own stats, as a CMVN file would
        feats, lens = model.fbank(batch["audio"], batch["audio_lens"])
        valid = feats[torch.arange(feats.size(1), device=device) < lens.to(device)[:, None]]
        model.set_cmvn(valid.mean(0), valid.std(0))
    model.train()
    optimizer = build_optimizer("adam", model.parameters(), LEARNING_RATE, WEIGHT_DECAY)
    # torch.compile over the whole model: the SRU++ recurrence, CTC and the encoder's padding check run eagerly
    # between the compiled graphs. The batch keeps its shape, so the first (warm-up) step compiles once.
    forward = torch.compile(model) if job.get("compile") else model
    if job.get("cuda_graphs"):
        forward = GraphedLosses(model, ShapeBuckets(*job["buckets"]), max_graphs=max(16, len(batches)))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=job["precision"] == "bf16")
    torch.backends.cudnn.benchmark = job.get("cudnn_benchmark", False)
    stream = itertools.cycle(batches)

    def train_step() -> torch.Tensor:
        batch = next(stream)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = forward(**batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        return loss

    times = []
    # The profile's steps go on through the batches where the timed ones stopped; the timed ones start at batch 0.
    for step in range(job["warmup_steps"] + job["steps"]):
        if step == job["warmup_steps"]:
            stream = itertools.cycle(batches)
        _sync(device)
        start = time.perf_counter()
        loss = train_step()
        _sync(device)
        if step >= job["warmup_steps"]:
            times.append(time.perf_counter() - start)
    profile = _profile(train_step, device, job["profile"]) if job.get("profile") else ""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - memory_before
    else:
        peak = _peak_rss_bytes() - memory_before
    graphs = forward.recorded if isinstance(forward, GraphedLosses) else None
    return {"times": times, "peak_memory": peak, "loss": float(loss.detach()), "profile": profile, "graphs": graphs}


def _profile(train_step, device: torch.device, steps: int, rows: int = 25) -> str:
    """torch.profiler over ``steps`` more training steps: the operators with the most self device time (self CPU
    time on a CPU), as a table, after a line giving the device time and the wall time per step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            train_step()
        _sync(device)
    wall = (time.perf_counter() - start) / steps
    host = ""
    if device.type == "cuda":  # how often a step makes the host wait for the GPU (each wait exposes launch time)
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                cpu_start, wall_start = time.process_time(), time.perf_counter()
                train_step()
                _sync(device)
                cpu, whole = time.process_time() - cpu_start, time.perf_counter() - wall_start
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        host = f"; unprofiled: {syncs} host syncs, {cpu * 1e3:.1f} ms of host CPU in a {whole * 1e3:.1f} ms step"
    averages = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    if device.type == "cuda":  # the kernels' own events: the time the GPU was busy
        from torch.autograd import DeviceType

        busy_us = sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA)
    else:
        busy_us = averages.self_cpu_time_total
    busy = busy_us / steps / 1e3
    # Operator calls per step, a proxy for kernel launches (and on a CPU the only count there is): every aten call,
    # nested ones included, and the top-level ones (not called from inside another aten operator).
    ops = [e for e in prof.events() if e.name.startswith("aten::")]
    top = sum(e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::") for e in ops)
    casts = sum(e.name == "aten::_to_copy" for e in ops)
    head = (
        f"per step (profiled, {steps} steps): {busy:.1f} ms of {device.type} time in a {wall * 1e3:.1f} ms step{host}"
        f"; {len(ops) / steps:.0f} aten calls ({top / steps:.0f} top-level, {casts / steps:.0f} aten::_to_copy)"
    )
    return head + "\n" + averages.table(sort_by=key, row_limit=rows, max_name_column_width=60)


def _run_isolated(job: dict[str, Any]) -> dict[str, Any]:
    # spawn, not fork: a fresh interpreter, so the peak RSS and the CUDA context are this encoder's alone.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (job,))


def _device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda ({torch.cuda.get_device_name()})"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.machine()
    return f"cpu ({name})"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def train_throughput(args: argparse.Namespace) -> list[str]:
    """Match the encoders' sizes, time each in its own process, and return the report's markdown lines."""
    size = SIZES[args.size]
    batch_seconds = args.batch_seconds or size.batch_seconds
    utt_seconds = tuple(args.utt_seconds or size.utt_seconds)
    steps = size.steps if args.steps is None else args.steps
    warmup = size.warmup_steps if args.warmup_steps is None else args.warmup_steps
    if args.cuda_graphs and warmup < args.batches:
        raise SystemExit("error: --cuda-graphs needs --warmup-steps of at least --batches (shapes record in warm-up)")
    if args.target_params is not None:
        target = round(args.target_params * 1e6)
    else:
        target = count_params(model_kwargs(size, "srupp", size.encoders["srupp"]))[args.match == "encoder"]
    configs = {name: model_kwargs(size, name, match_width(size, name, target, args.match)) for name in args.encoders}
    counts = {name: count_params(kwargs) for name, kwargs in configs.items()}
    matched = [c[args.match == "encoder"] for c in counts.values()]
    spread = max(matched) / min(matched) - 1
    if spread > MAX_SPREAD:
        detail = ", ".join(f"{name} {n:,}" for name, n in zip(counts, matched, strict=True))
        raise SystemExit(f"error: {args.match} parameter counts differ by {spread:.1%} (> 10%): {detail}")

    batches = synthetic_batches(batch_seconds, utt_seconds, args.batches)
    step_seconds = [float(b["audio_lens"].sum()) / SAMPLE_RATE for b in batches]
    timed_seconds = sum(step_seconds[i % args.batches] for i in range(steps))  # the timed steps start at batch 0
    threads = args.threads or torch.get_num_threads()
    cudnn = (", cudnn.benchmark" if args.cudnn_benchmark else "") + (", torch.compile" if args.compile else "")
    if args.cuda_graphs:
        cudnn += ", CUDA graphs for srupp (buckets: {:g} s, {:d} tokens, {:d} rows)".format(*args.buckets)
    if args.batches == 1:
        batch = batches[0]
        shape = (
            f"batch of {batch['audio'].size(0)} utterances, {step_seconds[0]:.1f} s of audio "
            f"({batch['audio'].numel() / SAMPLE_RATE:.1f} s padded), {int(batch['token_lens'].sum())} tokens"
        )
    else:
        rows = [b["audio"].size(0) for b in batches]
        shape = (
            f"{args.batches} batches in turn, {min(rows)}-{max(rows)} utterances and "
            f"{min(step_seconds):.1f}-{max(step_seconds):.1f} s of audio each"
        )
    lines = [
        f"device: {_device_name(args.device)}, {threads} CPU threads, torch {torch.__version__}, "
        f"{args.precision}{cudnn}",
        f"command: python {shlex.join(sys.argv)}",
        "",
        f"size {args.size}: {shape}, vocabulary {VOCAB_SIZE}; {warmup} warm-up + {steps} timed steps. "
        f"{args.match.capitalize()} parameters matched to {target / 1e6:.2f} M (spread {spread:.1%}, limit 10%).",
        "",
    ]
    if args.cuda_graphs or args.shapes_only:
        lines += [*bucket_padding(batches, ShapeBuckets(*args.buckets)), ""]
    if args.shapes_only:
        return lines
    # Rows: each encoder eagerly; with --cuda-graphs, SRU++ once more in graphs (the same batches, its own process).
    runs = [(name, name, False) for name in configs]
    if args.cuda_graphs:
        runs.insert(1, ("srupp, CUDA graphs", "srupp", True))
    results, encoder_of = {}, {}
    for label, name, graphs in runs:
        kwargs = configs[name]
        job = {
            "model": kwargs,
            "device": args.device,
            "precision": args.precision,
            "threads": args.threads,
            "batch_seconds": batch_seconds,
            "utt_seconds": utt_seconds,
            "steps": steps,
            "warmup_steps": warmup,
            "profile": args.profile,
            "cudnn_benchmark": args.cudnn_benchmark,
            "compile": args.compile,
            "batches": args.batches,
            "cuda_graphs": graphs,
            "buckets": tuple(args.buckets),
        }
        print(f"timing {label} ({counts[name][0] / 1e6:.2f} M parameters) ...", file=sys.stderr, flush=True)
        results[label], encoder_of[label] = _run_isolated(job), name

    def speed(result: dict[str, Any]) -> float:  # one batch: from the median step; several: over all timed steps
        times = result["times"]
        return step_seconds[0] / statistics.median(times) if args.batches == 1 else timed_seconds / sum(times)

    reference = "srupp" if "srupp" in results else next(iter(results))
    ref_speed = speed(results[reference])
    lines += [
        f"| encoder | width | params total | params encoder | audio s / s | ms / step (median) | "
        f"ms / step (mean) | speed vs {reference} | peak memory | final loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, result in results.items():
        name = encoder_of[label]
        key = WIDTH_KNOBS[name][0]
        median, mean = statistics.median(result["times"]), statistics.mean(result["times"])
        total, encoder = counts[name]
        graphs = "" if result["graphs"] is None else f" ({result['graphs']} recorded)"
        lines.append(
            f"| {label}{graphs} | {key} {configs[name]['encoder_conf'][key]} | {total / 1e6:.2f} M | "
            f"{encoder / 1e6:.2f} M | {speed(result):.1f} | {median * 1e3:.0f} | {mean * 1e3:.0f} | "
            f"{speed(result) / ref_speed:.2f}x | {_mib(result['peak_memory'])} | {result['loss']:.1f} |"
        )
    memory = "CUDA max_memory_allocated" if args.device == "cuda" else "peak RSS growth (ru_maxrss)"
    how = "the median step time" if args.batches == 1 else "the timed steps' audio over their total time"
    lines += ["", f"audio s / s from {how}; peak memory: {memory} from before the model was built."]
    for label, result in results.items():
        if result["profile"]:
            lines += ["", f"{label}: {result['profile']}"]
    return lines


def main() -> None:
    """Parse the options, run the benchmark and print its markdown report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="ci")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast, as bf16-mixed")
    parser.add_argument("--encoders", nargs="+", choices=ENCODER_NAMES, default=list(ENCODER_NAMES))
    parser.add_argument("--batch-seconds", type=float, help="audio per batch (default: the size's)")
    parser.add_argument("--utt-seconds", type=float, nargs=2, metavar=("LO", "HI"), help="utterance durations")
    parser.add_argument("--steps", type=int, help="timed steps (default: the size's)")
    parser.add_argument("--warmup-steps", type=int, help="untimed steps first (default: the size's)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--target-params", type=float, help="millions (default: the size's SRU++ preset)")
    parser.add_argument("--match", choices=("total", "encoder"), default="total", help="which count to match")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS", help="profile STEPS more steps per encoder")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model (compiled in the first warm-up step)"
    )
    parser.add_argument("--batches", type=int, default=1, metavar="K", help="K batches of different shapes in turn")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="SRU++'s step in CUDA graphs (srupp_asr.graphs; --device cuda)"
    )
    parser.add_argument(
        "--buckets",
        nargs=3,
        type=float,
        default=(1.0, 16, 8),
        metavar=("SECONDS", "TOKENS", "ROWS"),
        help="--cuda-graphs: the edges each batch is padded up to (default 1 16 8)",
    )
    parser.add_argument(
        "--shapes-only",
        action="store_true",
        help="print the batches' padding to --buckets (and the graphs they need) and stop before timing",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        parser.error("--warmup-steps must not be negative")
    if args.batch_seconds is not None and args.batch_seconds <= 0:
        parser.error("--batch-seconds must be positive")
    if args.utt_seconds is not None and not 0.1 <= args.utt_seconds[0] <= args.utt_seconds[1]:
        parser.error("--utt-seconds LO HI needs 0.1 <= LO <= HI")
    if args.profile < 0:
        parser.error("--profile must not be negative")
    if args.compile and args.warmup_steps == 0:
        parser.error("--compile needs a warm-up step (the first step compiles)")
    if args.batches < 1:
        parser.error("--batches must be at least 1")
    seconds, tokens, rows = args.buckets
    if seconds <= 0 or tokens < 1 or rows < 1 or tokens != int(tokens) or rows != int(rows):
        parser.error("--buckets needs SECONDS > 0 and whole TOKENS, ROWS >= 1")
    args.buckets = (seconds, int(tokens), int(rows))
    if args.cuda_graphs and (args.device != "cuda" or "srupp" not in args.encoders):
        parser.error("--cuda-graphs needs --device cuda and the srupp encoder")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for line in train_throughput(args):
        print(line)


if __name__ == "__main__":
    main()
