"""SRU++ against Conformer and BLSTM on the synthetic English corpus: same data, matched size, same time budget.

For each encoder a model is trained with ``srupp-asr train fit`` from ``--config`` (default
``conf/synth_en_cpu.yaml``: everything but the encoder is shared), the encoder's width chosen so that the whole
model's parameter count matches the SRU++ model's within 10% (``train_throughput.match_width``: Conformer
``ffn_dim``, BLSTM ``d_model``; the presets below fix the other shape choices), for the same wall-clock
budget (``--minutes``; each run alone on the machine, one after the other). Then per model:

- parameters, training steps, audio seen per second of training (steps x the average batch's audio), peak
  resident memory of the training process;
- WER of the exported model (the best checkpoint by valid loss; ``--num-avg`` averages more) on dev,
  test_seen (training voices, unseen sentences) and test_unseen (held-out voices) with greedy CTC and joint
  CTC/attention decoding (beam 10), and the decoding real-time factor (``srupp-asr evaluate``);
- long-form: recordings of ``--lengths`` minutes made by concatenating test_seen utterances with 0.3-0.8 s
  silences, their references joined; decoded by ``srupp-asr transcribe`` with greedy CTC as one whole file
  (no chunking; the encoder sees the whole recording, as the paper's long-form test) and in 30 s chunks
  (``--max-chunk-seconds 30``), in a fresh process capped at ``--max-memory-gb`` of address space, so a model
  that cannot hold a recording fails with an allocation error (reported) instead of swapping the machine.
  The models were trained on single utterances (2-25 s) only;
- real human speech (``--real-dev DIR``, default ``../shared/data/real_en`` when present, skipped with a note when
  not): WER of each model on the real dev sets with joint CTC/attention decoding, beside pocketsphinx
  (``benchmarks/real_speech.py``).

Prints the tables, writes them with the commands to ``--out`` (default ``benchmarks/RESULTS.md``, the section
between its ``compare_encoders`` markers), and PNG plots (WER vs length, dev WER vs training time) beside it.

    python benchmarks/compare_encoders.py --minutes 10                  # about 50 min on 2 CPU cores
    python benchmarks/compare_encoders.py --skip-train --exp exp/compare  # evaluate existing runs again
    python benchmarks/compare_encoders.py --config conf/synth_en_gpu.yaml --presets gpu --device cuda \
        --minutes 5 --data data/synth_en_gpu --exp exp/compare_gpu      # the GPU size (16 M parameters)

On a GPU, training, evaluation and long-form decoding run there (``--device cuda``; the config names the
accelerator); the memory columns stay the process's peak resident memory on the host.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import soundfile as sf
import yaml
from real_speech import find_real_dev, real_dev_table, skip_note
from train_throughput import MAX_SPREAD, Size, count_params, match_width
from transcribe_memory import measure

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.fileio import atomic_write_text
from srupp_asr.scoring.align import align, word_tokens
from srupp_asr.text import normalize_text

ROOT = Path(__file__).resolve().parent.parent
ENCODERS = ("srupp", "conformer", "blstm")
# Shape presets per size (``--presets``): cpu for conf/synth_en_cpu.yaml's SRU++ (4 layers, no dropout), gpu for
# conf/synth_en_gpu.yaml's (8 layers, dropout 0.1). The width knob of conformer (ffn_dim) and blstm (d_model) is
# then searched to match the SRU++ model's parameter count.
PRESETS = {
    "cpu": {
        "conformer": {
            "num_layers": 4,
            "num_heads": 4,
            "ffn_dim": 512,
            "depthwise_conv_kernel_size": 15,
            "dropout": 0.0,
        },
        "blstm": {"d_model": 512, "num_layers": 3, "dropout": 0.0},
    },
    "gpu": {
        "conformer": {
            "num_layers": 8,
            "num_heads": 4,
            "ffn_dim": 1024,
            "depthwise_conv_kernel_size": 15,
            "dropout": 0.1,
        },
        "blstm": {"d_model": 1024, "num_layers": 4, "dropout": 0.1},
    },
}
MARK_BEGIN, MARK_END = "<!-- compare_encoders: begin -->", "<!-- compare_encoders: end -->"


def srupp_cmd() -> list[str]:
    """The CLI of this interpreter's srupp-asr."""
    return [sys.executable, "-m", "srupp_asr.cli"]


def encoder_configs(base: dict, vocab_size: int, presets: str = "cpu") -> dict[str, dict]:
    """Per encoder, the training config: ``base`` with the encoder (width-matched to the SRU++ one, the other shape
    choices from ``PRESETS[presets]``) replaced."""
    model = base["model"]
    srupp_conf = model["encoder_conf"]
    size = Size(
        d_model=model["d_model"],
        decoder_conf=model["decoder_conf"],
        encoders={"srupp": srupp_conf, **PRESETS[presets]},
        batch_seconds=0,
        utt_seconds=(0, 0),
        steps=0,
        warmup_steps=0,
        specaugment=model.get("specaugment"),
    )
    import train_throughput

    train_throughput.VOCAB_SIZE = vocab_size  # match on this tokenizer's vocabulary
    target = count_params(train_throughput.model_kwargs(size, "srupp", srupp_conf))[0]
    configs = {}
    for name in ENCODERS:
        conf = srupp_conf if name == "srupp" else match_width(size, name, target, "total")
        configs[name] = {**base, "model": {**model, "encoder": name, "encoder_conf": dict(conf)}}
    return configs


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM) in MiB, 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def train(name: str, config: dict, args: argparse.Namespace) -> dict:
    """Train one model for ``args.minutes`` (skipped when its run is complete); returns its training numbers."""
    exp = args.exp / name
    exp.mkdir(parents=True, exist_ok=True)
    config = {**config, "trainer": {**config["trainer"], "max_time": f"00:00:{int(args.minutes):02d}:00"}}
    atomic_write_text(exp / "train_config.yaml", yaml.safe_dump(config, sort_keys=False))
    record = exp / "train_record.json"
    if record.is_file():
        return json.loads(record.read_text())
    m = args.data / "corpus" / "manifests"
    cmd = [*srupp_cmd(), "train", "fit", "--config", str(exp / "train_config.yaml")]
    cmd += ["--data.train_cuts", str(m / "train_cuts.jsonl.gz"), "--data.valid_cuts", str(m / "dev_cuts.jsonl.gz")]
    cmd += ["--data.tokenizer", str(args.data / "tokenizer.model"), "--model.cmvn", str(args.data / "cmvn.json")]
    cmd += ["--trainer.default_root_dir", str(exp)]
    print(f"[{name}] training for {args.minutes:g} min: {' '.join(cmd)}", file=sys.stderr, flush=True)
    begin = time.perf_counter()
    with open(exp / "train.log", "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        peak = 0.0
        while child.poll() is None:
            peak = max(peak, peak_rss_mib(child.pid))
            time.sleep(1.0)
    wall = time.perf_counter() - begin
    if child.returncode != 0:
        raise SystemExit(f"[{name}] training failed (exit {child.returncode}); see {exp / 'train.log'}")
    steps, epochs, curve = read_curve(exp)
    numbers = {"wall_s": wall, "steps": steps, "epochs": epochs, "peak_rss_mib": peak, "curve": curve}
    atomic_write_text(record, json.dumps(numbers, indent=1))
    return numbers


def export(exp: Path, num_avg: int) -> None:
    """Average the ``num_avg`` best checkpoints of a run (by valid loss) into ``exp/model``; when that changes the
    model, the decoding results of the previous one are removed."""
    import shutil

    marker = exp / "model_num_avg.txt"
    if (exp / "model").is_dir() and marker.is_file() and marker.read_text().strip() == str(num_avg):
        return
    cmd = [*srupp_cmd(), "average", "--exp-dir", str(exp), "--num", str(num_avg), "--out", str(exp / "model")]
    subprocess.run(cmd, check=True, capture_output=True)
    for stale in [*exp.glob("decode_*"), exp / "longform"]:
        shutil.rmtree(stale, ignore_errors=True)
    atomic_write_text(marker, f"{num_avg}\n")


def read_curve(exp: Path) -> tuple[int, float, list[tuple[int, float, float]]]:
    """(last step, epochs as a fraction, [(step, valid loss, dev WER)]) from the run's CSV log."""
    (path,) = sorted((exp / "csv").glob("version_*/metrics.csv"))[-1:]
    rows = list(csv.DictReader(path.read_text().splitlines()))
    steps = max(int(r["step"]) for r in rows) + 1
    # batches per epoch: the first step logged with epoch 1
    first = [int(r["step"]) for r in rows if r.get("epoch") and int(r["epoch"]) >= 1]
    epochs = steps / min(first) if first else float("nan")  # nan: the first epoch did not end
    curve = [(int(r["step"]) + 1, float(r["valid/loss"]), float(r["valid/wer"])) for r in rows if r.get("valid/loss")]
    return steps, epochs, curve


def evaluate(name: str, args: argparse.Namespace) -> dict:
    """WER and RTF of the model on each test set and decoding mode (cached in results.json files)."""
    out = {}
    for cuts in ("dev", "test_seen", "test_unseen"):
        for mode in ("ctc_greedy", "joint"):
            folder = args.exp / name / f"decode_{mode}" / cuts
            if not (folder / "results.json").is_file():
                manifest = args.data / "corpus" / "manifests" / f"{cuts}_cuts.jsonl.gz"
                cmd = [*srupp_cmd(), "evaluate", "--model", str(args.exp / name / "model"), "--cuts", str(manifest)]
                cmd += ["--decoding", mode, "--beam", "10", "--device", args.device, "--name", cuts]
                cmd += ["--out-dir", str(folder)]
                subprocess.run(cmd, check=True, capture_output=True)
            r = json.loads((folder / "results.json").read_text())
            out[(cuts, mode)] = (r["WER"]["error_rate"], float(r["details"]["real-time factor"]))
    return out


def build_longform(args: argparse.Namespace) -> list[tuple[float, Path, str]]:
    """Recordings of each length from test_seen utterances in manifest order with pauses; (minutes, path, ref)."""
    from srupp_asr.manifest import cut_text, load_cuts

    folder = args.exp / "longform"
    folder.mkdir(parents=True, exist_ok=True)
    cuts = list(load_cuts(args.data / "corpus" / "manifests" / "test_seen_cuts.jsonl.gz"))
    rng = np.random.default_rng(0)
    made = []
    for minutes in args.lengths:
        path, ref_path = folder / f"long_{minutes:g}min.flac", folder / f"long_{minutes:g}min.txt"
        if not path.is_file():
            pieces, words, total, i = [], [], 0, 0
            while total < minutes * 60 * SAMPLE_RATE:
                cut = cuts[i % len(cuts)]
                audio = cut.load_audio()[0].astype(np.float32)
                pause = np.zeros(int(rng.uniform(0.3, 0.8) * SAMPLE_RATE), np.float32)
                pieces += [audio, pause]
                words.append(cut_text(cut))
                total += len(audio) + len(pause)
                i += 1
            sf.write(path, np.concatenate(pieces), SAMPLE_RATE, format="FLAC")
            atomic_write_text(ref_path, " ".join(words) + "\n")
        made.append((minutes, path, ref_path.read_text().strip()))
    return made


def longform(name: str, recordings: list, args: argparse.Namespace) -> dict:
    """WER, RTF and peak memory of whole-file and 30 s-chunk decoding of each recording."""
    results = {}
    opts = SimpleNamespace(
        decoding="ctc_greedy", threads=2, max_memory_gb=args.max_memory_gb, vad=False, device=args.device
    )
    for minutes, path, ref in recordings:
        for how, chunk in (("whole", 10 * 3600.0), ("chunked", 30.0)):
            out_dir = args.exp / name / "longform" / how
            cache = out_dir / f"{path.stem}.result.json"
            if cache.is_file():
                results[(minutes, how)] = json.loads(cache.read_text())
                continue
            out_dir.mkdir(parents=True, exist_ok=True)
            m = measure(path, args.exp / name / "model", out_dir, chunk, opts)
            if not m["failed"]:
                hyp = json.loads((out_dir / f"{path.stem}.json").read_text())["text"]
                m["wer"] = align(word_tokens(normalize_text(ref)), word_tokens(normalize_text(hyp))).counts.error_rate
            m["rtf"] = m["wall"] / (minutes * 60)
            atomic_write_text(cache, json.dumps(m))
            results[(minutes, how)] = m
    return results


def plots(train_numbers: dict, long_results: dict, lengths: list[float], out_dir: Path, where: str) -> list[str]:
    """WER vs recording length and dev WER vs training minutes, as PNGs in ``out_dir``; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, res in long_results.items():
        for how, style in (("whole", "-o"), ("chunked", "--s")):
            ys = [res[(m, how)].get("wer") for m in lengths]
            ax.plot(lengths, [np.nan if y is None else y for y in ys], style, label=f"{name} {how}")
    ax.set_xscale("log")
    ax.set_xlabel("recording length (min)")
    ax.set_ylabel("WER % (greedy CTC)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "compare_wer_vs_length.png", dpi=100)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, t in train_numbers.items():
        per_step = t["wall_s"] / max(t["steps"], 1) / 60
        ax.plot([s * per_step for s, _, _ in t["curve"]], [w for _, _, w in t["curve"]], "-o", label=name)
    ax.set_xlabel(f"training minutes ({where})")
    ax.set_ylabel("dev WER % (greedy CTC)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "compare_wer_vs_time.png", dpi=100)
    plt.close("all")
    return ["compare_wer_vs_length.png", "compare_wer_vs_time.png"]


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "conf" / "synth_en_cpu.yaml")
    p.add_argument("--data", type=Path, default=ROOT / "data" / "synth_en", help="corpus, tokenizer.model, cmvn.json")
    p.add_argument("--exp", type=Path, default=ROOT / "exp" / "compare")
    p.add_argument("--minutes", type=float, default=10.0, help="training wall-clock per model")
    p.add_argument("--lengths", type=float, nargs="+", default=[1.0, 5.0, 20.0], help="long-form minutes")
    p.add_argument("--max-memory-gb", type=float, default=16.0)
    p.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=ENCODERS)
    p.add_argument("--skip-train", action="store_true", help="use the trained runs in --exp")
    p.add_argument(
        "--num-avg",
        type=int,
        default=1,
        help="checkpoints averaged (1: the best; a short run's early "
        "checkpoints are far worse than its last ones, so averaging them hurts)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    p.add_argument("--device", default="cpu", help="decoding device: cpu or cuda (the config says where to train)")
    p.add_argument("--presets", choices=list(PRESETS), default="cpu", help="conformer/blstm shapes (see PRESETS)")
    p.add_argument("--real-dev", type=Path, help="real speech folder (default: ../shared/data/real_en when present)")
    args = p.parse_args()
    real_dev = find_real_dev(args.real_dev)
    from srupp_asr.tokenizer import Tokenizer

    base = yaml.safe_load(args.config.read_text())
    configs = encoder_configs(base, Tokenizer(args.data / "tokenizer.model").vocab_size, args.presets)
    counts = {
        n: count_params(
            {
                "vocab_size": Tokenizer(args.data / "tokenizer.model").vocab_size,
                **{k: v for k, v in c["model"].items() if k not in NOT_MODEL},
            }
        )[0]
        for n, c in configs.items()
    }
    spread = (max(counts.values()) - min(counts.values())) / min(counts.values())
    assert spread <= MAX_SPREAD, counts
    trained = {}
    for name in args.encoders:
        if args.skip_train and not (args.exp / name / "train_record.json").is_file():
            raise SystemExit(f"--skip-train: {args.exp / name} has no finished run")
        trained[name] = train(name, configs[name], args)
        export(args.exp / name, args.num_avg)
    scores = {name: evaluate(name, args) for name in args.encoders}
    recordings = build_longform(args)
    long_results = {name: longform(name, recordings, args) for name in args.encoders}
    batch_audio = base["data"]["max_duration"]
    lines = [
        f"Machine: {_machine(args.device)}; torch {_torch_version()}; "
        f"{time.strftime('%Y-%m-%d')}. Config: {_shown(args.config)} with the encoder replaced; "
        f"{args.minutes:g} min of training each.",
        "",
        "    python benchmarks/compare_encoders.py " + " ".join(sys.argv[1:]),
        "",
        "| encoder | params | encoder conf | steps | epochs | audio s / s (at most) | train peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.encoders:
        t, conf = trained[name], configs[name]["model"]["encoder_conf"]
        shown = ", ".join(f"{k}={v}" for k, v in conf.items() if k not in ("dropout", "attn_dropout"))
        epochs = "< 1" if t["epochs"] != t["epochs"] else f"{t['epochs']:.1f}"  # nan: the first epoch did not end
        lines.append(
            f"| {name} | {counts[name] / 1e6:.2f} M | {shown} | {t['steps']} | {epochs} | "
            f"{t['steps'] * batch_audio / t['wall_s']:.0f} | {t['peak_rss_mib']:.0f} |"
        )
    lines += [
        "",
        "| encoder | decoding | dev WER % | test_seen WER % | test_unseen WER % | RTF (test_seen) |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.encoders:
        for mode in ("ctc_greedy", "joint"):
            s = scores[name]
            lines.append(
                f"| {name} | {mode} | {_rate(s[('dev', mode)][0])} | {_rate(s[('test_seen', mode)][0])} | "
                f"{_rate(s[('test_unseen', mode)][0])} | {s[('test_seen', mode)][1]:.4f} |"
            )
    lines += [
        "",
        "Long-form (test_seen utterances joined; greedy CTC; whole file vs 30 s chunks):",
        "",
        "| encoder | decoding | " + " | ".join(f"{m:g} min WER % / RTF / peak MiB" for m in args.lengths) + " |",
        "|---|---|" + "---|" * len(args.lengths),
    ]
    for name in args.encoders:
        for how in ("whole", "chunked"):
            cells = []
            for m in args.lengths:
                r = long_results[name][(m, how)]
                cells.append(
                    f"failed: {r['failed'][:40]}"
                    if r["failed"]
                    else f"{_rate(r['wer'])} / {r['rtf']:.3f} / {r['rss']:.0f}"
                )
            lines.append(f"| {name} | {how} | " + " | ".join(cells) + " |")
    if real_dev is None:
        lines += ["", skip_note("compare_encoders: real speech")]
    else:
        models = {name: args.exp / name / "model" for name in args.encoders}
        lines += ["", f"Real human speech ({_shown(real_dev)}, dev splits; joint decoding, beam 10 as above):", ""]
        lines += real_dev_table(real_dev, args.exp / "real_dev", models, decoding="joint", device=args.device)
    where = f"{os.cpu_count()} CPU cores" if args.device == "cpu" else _machine(args.device)
    pngs = plots(trained, long_results, args.lengths, args.out.parent, where)
    lines += ["", *[f"![{png}]({png})" for png in pngs]]
    text = "\n".join(lines) + "\n"
    print(text)
    old = args.out.read_text() if args.out.is_file() else "# Benchmarks\n"
    section = f"{MARK_BEGIN}\n{text}{MARK_END}"
    if MARK_BEGIN in old:
        new = old[: old.index(MARK_BEGIN)] + section + old[old.index(MARK_END) + len(MARK_END) :]
    else:
        new = old.rstrip("\n") + "\n\n## SRU++ vs Conformer vs BLSTM (compare_encoders.py)\n\n" + section + "\n"
    atomic_write_text(args.out, new)


NOT_MODEL = {"cmvn", "lr", "weight_decay", "warmup_steps", "optimizer", "max_consecutive_nonfinite"}


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it, else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _machine(device: str) -> str:
    """The CPU (processor, core count) and, for a CUDA device, the GPU's name."""
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    if device == "cpu":
        return cpu
    import torch

    return f"{torch.cuda.get_device_name()} ({cpu})"


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
