"""Decoding speed of every mode: real-time factor on the CPU (2 threads by default) or a GPU; prints markdown.

A model directory (``--model``, as ``srupp-asr average`` exports it) decodes ``--audio`` files (or, without them,
sentences that espeak-ng speaks; Gaussian noise where espeak-ng is missing), all in one padded batch. Without
``--model`` the model is ``conf/tiny_cpu.yaml``'s architecture (the size the tests overfit) with random weights
and a 40-piece vocabulary: an untrained decoder rarely ends a hypothesis, so the beam modes run to their length
limit, an upper bound on their search cost.

For each mode the table gives the median over ``--repeat`` runs of the end-to-end time (:func:`decode`: encoder,
search, forced alignment) and of the search alone (:func:`decode_encoded` on a ready encoding, alignment
included), the real-time factor (seconds of computation per second of audio; below 1 is faster than real time)
and the ratio to ``ctc_greedy`` in the same run.

    python benchmarks/decoding_speed.py                              # untrained tiny model, CPU, 2 threads
    python benchmarks/decoding_speed.py --model exp/synth_en/model --audio a.wav b.wav --beam 10
    python benchmarks/decoding_speed.py --model exp/synth_en/model --device cuda
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from srupp_asr.audio import SAMPLE_RATE, load_audio
from srupp_asr.decoding import MODES, DecodingOptions, decode, decode_encoded
from srupp_asr.model import ASRModel
from srupp_asr.model_dir import load_model_dir
from srupp_asr.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "conf" / "tiny_cpu.yaml"
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "she sells sea shells by the sea shore",
    "a journey of a thousand miles begins with a single step",
    "the rain in spain stays mainly in the plain",
    "all that glitters is not gold",
    "time and tide wait for no man",
    "actions speak louder than words",
    "better late than never but never late is better",
]
NOISE_SECONDS = (2.0, 4.0)  # durations of the noise utterances when there is no speech to read


def untrained_model(folder: Path) -> tuple[ASRModel, Tokenizer]:
    """conf/tiny_cpu.yaml's model with random weights and a char tokenizer of the benchmark's sentences."""
    tokenizer = Tokenizer.train(SENTENCES, folder / "tokenizer.model", vocab_size=40, model_type="char")
    settings = yaml.safe_load(TINY_CONFIG.read_text())["model"]
    names = ("n_mels", "d_model", "subsampling", "encoder", "encoder_conf", "decoder_conf", "ctc_weight")
    torch.manual_seed(0)
    model = ASRModel(tokenizer.vocab_size, **{k: settings[k] for k in names}, specaugment=None)
    return model.eval(), tokenizer


def speech(folder: Path) -> list[torch.Tensor]:
    """The benchmark's sentences spoken by espeak-ng, or Gaussian noise utterances without it."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        generator = torch.Generator().manual_seed(0)
        return [0.1 * torch.randn(int(s * SAMPLE_RATE), generator=generator) for s in NOISE_SECONDS * 4]
    waves = []
    for i, text in enumerate(SENTENCES):
        path = folder / f"s{i}.wav"
        subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True, timeout=60)
        waves.append(torch.from_numpy(load_audio(path)))
    return waves


def padded(waves: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One zero-padded ``(B, S)`` batch and its ``(B,)`` lengths."""
    lens = torch.tensor([w.numel() for w in waves])
    audio = torch.zeros(len(waves), int(lens.max()))
    for i, w in enumerate(waves):
        audio[i, : w.numel()] = w
    return audio, lens


def median_seconds(fn, repeat: int, device: torch.device) -> float:
    """Median wall time of ``fn()`` over ``repeat`` runs after one untimed run."""
    fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model directory (default: untrained conf/tiny_cpu.yaml model)")
    p.add_argument("--audio", nargs="+", type=Path, help="audio files to decode (default: espeak-ng speech)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    p.add_argument("--beam", type=int, default=10)
    p.add_argument("--ctc-weight", type=float, default=0.3)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model, tokenizer = load_model_dir(args.model, device)
        else:
            model, tokenizer = untrained_model(Path(tmp))
            model.to(device)
        waves = [torch.from_numpy(load_audio(f)) for f in args.audio] if args.audio else speech(Path(tmp))
    audio, lens = padded(waves)
    seconds = lens.sum().item() / SAMPLE_RATE
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio.to(device), lens.to(device))
    rows = []
    for mode in MODES:
        options = DecodingOptions(mode=mode, beam=args.beam, ctc_weight=args.ctc_weight)
        total = median_seconds(lambda o=options: decode(model, tokenizer, audio, lens, o), args.repeat, device)
        search = median_seconds(
            lambda o=options: decode_encoded(model, tokenizer, enc, enc_lens, o), args.repeat, device
        )
        rows.append((mode, total, search))
    greedy = rows[0][1]
    name = str(args.model) if args.model else "untrained conf/tiny_cpu.yaml model (searches run to their limit)"
    threads = f", {args.threads} threads" if device.type == "cpu" else ""
    print(
        f"Model: {name}, {model.num_params() / 1e6:.2f} M parameters; {len(waves)} utterances, {seconds:.1f} s "
        f"of audio in one batch; {device.type}{threads}; beam {args.beam}, ctc_weight {args.ctc_weight}\n"
    )
    print("| mode | decode s | RTF | x ctc_greedy | search s | search RTF |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, total, search in rows:
        print(
            f"| {mode} | {total:.3f} | {total / seconds:.4f} | {total / greedy:.1f} | {search:.3f} | "
            f"{search / seconds:.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
