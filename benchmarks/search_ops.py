"""Where a beam search's work goes, step by step: operator calls, host syncs and (on a GPU) kernel launches per
output step, for each scorer of the search; prints markdown.

Issue 39 asks for joint decoding at RTF <= 0.005 on a GPU. There the encoder is nearly free and the search is a long
chain of small operations: each costs a launch (and the Python around it) whatever its size, and each host sync
(``.item()``, ``.tolist()``, ``bool(tensor)``) stops the host until the device has caught up. So the search's speed
on a GPU follows the number of calls and syncs per output step, which this counts with ``torch.profiler``, on the
CPU as on a GPU (the counts are the same; a GPU adds its launches). Calls that only make a view launch nothing; the
others ("computing calls") stand in for the launches on the CPU. Times are not given: ``decoding_speed.py`` and
``decoding_defaults.py`` measure those.

A model directory (``--model``, default the built-in model) decodes espeak-ng sentences (``decoding_speed.py``'s; or
``--audio`` files) in one batch, encoded once; the joint search then runs once untimed and once under the profiler,
with the model directory's LM at its fusion weight (``--no-lm``: none). A step is one call of the attention
decoder's scorer (one per output step).

    python benchmarks/search_ops.py                                   # built-in model + LM, CPU
    python benchmarks/search_ops.py --device cuda                     # the same on a GPU, with kernel launches
    python benchmarks/search_ops.py --ctc-recursion scan              # the CTC frames in closed form (a GPU's way)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decoding_speed

from srupp_asr.audio import load_audio
from srupp_asr.decoding import DecodingOptions, decode_encoded, scorers
from srupp_asr.lm import load_lm
from srupp_asr.model_dir import load_model_dir
from srupp_asr.model_files import read_lm_config

REPO = Path(__file__).resolve().parent.parent
PARTS = {  # the scorers' methods counted apart; the rest is the search's own work
    "decoder": (scorers.DecoderScorer, ("score", "select")),
    "LM": (scorers.LMScorer, ("score", "select")),
    "CTC prefix": (scorers.CTCPrefixScorer, ("score", "select")),
}
STEP_LABEL = "part decoder: DecoderScorer.score"
SYNCS = ("aten::_local_scalar_dense", "tolist")  # what .item(), int() and bool() of a tensor run; .tolist() (labelled)
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
# Operators that only make a view of a tensor (no kernel on a GPU): the other calls each compute something, and on a
# GPU each of those is (about) one kernel launch, so on the CPU they stand in for the launches.
_VIEW_NAMES = """alias as_strided chunk detach expand expand_as lift_fresh narrow permute reshape select slice split
squeeze t transpose unbind unflatten unsqueeze view _unsafe_view"""
VIEWS = frozenset("aten::" + name for name in _VIEW_NAMES.split())


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """Each scorer method runs inside a ``record_function`` named ``part NAME: Class.method``, and ``Tensor.tolist``
    inside one named ``tolist`` (it runs no aten operator on the CPU, and a device-to-host copy on a GPU); all
    restored after."""
    saved = [(torch.Tensor, "tolist", torch.Tensor.tolist)]

    def tolist(self, _f=torch.Tensor.tolist):
        with torch.profiler.record_function("tolist"):
            return _f(self)

    torch.Tensor.tolist = tolist
    for name, (cls, methods) in PARTS.items():
        for method in methods:
            original = getattr(cls, method)
            saved.append((cls, method, original))

            def labelled(self, *args, _f=original, _label=f"part {name}: {cls.__name__}.{method}", **kwargs):
                with torch.profiler.record_function(_label):
                    return _f(self, *args, **kwargs)

            setattr(cls, method, labelled)
    try:
        yield
    finally:
        for cls, method, original in saved:
            setattr(cls, method, original)


def part_of(event) -> str:
    """The part whose label encloses ``event`` (its nearest ``part ...`` ancestor), or ``search``."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("part "):
            return parent.name[5:].split(":")[0]
        parent = parent.cpu_parent
    return "search"


def count(events) -> tuple[int, dict[str, collections.Counter]]:
    """Output steps, and per part: top-level aten calls (an aten call inside another is not counted again), those of
    them that compute (not a view: :data:`VIEWS`), host syncs and kernel launches."""
    steps = sum(1 for e in events if e.name == STEP_LABEL)
    parts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        if e.name in SYNCS:
            parts[part_of(e)]["syncs"] += 1
        if e.name.startswith("aten::"):
            parent = e.cpu_parent
            if parent is None or not parent.name.startswith("aten::"):
                parts[part_of(e)]["calls"] += 1
                parts[part_of(e)]["compute"] += e.name not in VIEWS
        elif e.name in LAUNCHES:
            parts[part_of(e)]["launches"] += 1
    return steps, parts


def table(steps: int, parts: dict[str, collections.Counter], cuda: bool) -> list[str]:
    """Markdown rows: per part, calls, computing calls, syncs (and launches) per output step, and the share of the
    computing calls."""
    total = sum(c["compute"] for c in parts.values()) or 1
    head = "| part | aten calls / step | computing calls / step | host syncs / step |"
    head += " kernel launches / step |" if cuda else ""
    lines = [head + " share of computing calls |", "|---|---|---|---|" + ("---|" if cuda else "") + "---|"]
    order = [p for p in (*PARTS, "search") if p in parts]
    for name in [*order, "all"]:
        c = sum(parts.values(), collections.Counter()) if name == "all" else parts[name]
        row = f"| {name} | {c['calls'] / steps:.1f} | {c['compute'] / steps:.1f} | {c['syncs'] / steps:.1f} |"
        row += f" {c['launches'] / steps:.1f} |" if cuda else ""
        lines.append(row + f" {100.0 * c['compute'] / total:.0f}% |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "srupp_asr" / "default_model", help="model directory")
    p.add_argument("--audio", nargs="+", type=Path, help="audio files (default: espeak-ng sentences)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--ctc-weight", type=float, default=0.3)
    p.add_argument("--no-lm", action="store_true", help="leave out the model directory's LM")
    p.add_argument(
        "--ctc-recursion",
        default="auto",
        choices=["auto", "loop", "scan"],
        help="how the CTC prefix scorer runs its frames (scorers.CTC_RECURSION; default auto: scan on a GPU)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    model, tokenizer = load_model_dir(args.model, device)
    lm, lm_weight = None, None
    if not args.no_lm and (args.model / "lm").is_dir():
        lm, _ = load_lm(args.model / "lm", device)
        lm_weight = float(read_lm_config(args.model / "lm")[1].get("fusion_weight", 0.4))
    with tempfile.TemporaryDirectory() as tmp:
        waves = (
            [torch.from_numpy(load_audio(f)) for f in args.audio] if args.audio else decoding_speed.speech(Path(tmp))
        )
    audio, lens = decoding_speed.padded(waves)
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio.to(device), lens.to(device))
    options = DecodingOptions(mode="joint", beam=args.beam, ctc_weight=args.ctc_weight, lm_weight=lm_weight)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    saved, scorers.CTC_RECURSION = scorers.CTC_RECURSION, args.ctc_recursion
    try:
        with instrumented():
            decode_encoded(model, tokenizer, enc, enc_lens, options, lm=lm)  # untimed: first calls, caches
            with torch.profiler.profile(activities=activities) as prof:
                decode_encoded(model, tokenizer, enc, enc_lens, options, lm=lm)
    finally:
        scorers.CTC_RECURSION = saved
    steps, parts = count(prof.events())
    if not steps:
        sys.exit("search_ops: the search made no step (no attention decoder?)")
    lm_text = f"LM {args.model / 'lm'} at {lm_weight:g}" if lm is not None else "no LM"
    print(
        f"Model: {args.model}; {len(waves)} utterances in one batch; {args.device}; joint, beam {args.beam}, "
        f"ctc_weight {args.ctc_weight:g}, {lm_text}; CTC frames: {args.ctc_recursion}; {steps} output steps\n"
    )
    print("\n".join(table(steps, parts, device.type == "cuda")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
