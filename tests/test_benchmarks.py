"""benchmarks/train_throughput.py: matched parameter counts, the synthetic batch, timed steps, the command line."""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "train_throughput.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("train_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


tt = _load_benchmark()


def _args(**options) -> argparse.Namespace:
    """The command line's defaults at the ci size on the CPU, with ``options`` changed."""
    defaults = {"size": "ci", "encoders": list(tt.ENCODER_NAMES), "batch_seconds": None, "utt_seconds": None}
    defaults |= {"steps": None, "warmup_steps": None, "target_params": None, "match": "total", "device": "cpu"}
    defaults |= {"precision": "fp32", "threads": None, "profile": 0, "cudnn_benchmark": False, "compile": False}
    defaults |= {"batches": 1, "cuda_graphs": False, "buckets": (1.0, 16, 8), "shapes_only": False}
    return argparse.Namespace(**{**defaults, **options})


def _counts(size_name: str, match: str) -> dict[str, tuple[int, int]]:
    size = tt.SIZES[size_name]
    target = tt.count_params(tt.model_kwargs(size, "srupp", size.encoders["srupp"]))[match == "encoder"]
    return {
        name: tt.count_params(tt.model_kwargs(size, name, tt.match_width(size, name, target, match)))
        for name in tt.ENCODER_NAMES
    }


@pytest.mark.parametrize("match", ["total", "encoder"])
def test_ci_size_matches_parameter_counts_within_ten_percent(match):
    matched = [c[match == "encoder"] for c in _counts("ci", match).values()]
    assert max(matched) / min(matched) - 1 <= tt.MAX_SPREAD


@pytest.mark.slow
@pytest.mark.parametrize("size_name", ["small", "large"])
def test_gpu_sizes_match_total_parameter_counts_within_ten_percent(size_name):
    counts = _counts(size_name, "total")
    totals = [total for total, _ in counts.values()]
    assert max(totals) / min(totals) - 1 <= tt.MAX_SPREAD
    if size_name == "large":
        assert 90e6 < counts["srupp"][0] < 110e6  # about ESPnet's LibriSpeech Conformer


def test_srupp_keeps_its_preset_width_when_it_sets_the_target():
    size = tt.SIZES["small"]
    target = tt.count_params(tt.model_kwargs(size, "srupp", size.encoders["srupp"]))[0]
    assert tt.match_width(size, "srupp", target, "total") == size.encoders["srupp"]


def test_synthetic_batch_is_reproducible_and_fills_the_budget():
    batch = tt.synthetic_batch(10.0, (2.0, 3.0))
    again = tt.synthetic_batch(10.0, (2.0, 3.0))
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    lens = batch["audio_lens"]
    assert 7.0 <= float(lens.sum()) / tt.SAMPLE_RATE <= 10.0  # another 2-3 s utterance would not fit
    assert batch["audio"].shape == (lens.numel(), int(lens.max()))
    for row, n in zip(batch["audio"], lens.tolist(), strict=True):
        assert torch.all(row[n:] == 0) and row[:n].abs().sum() > 0
    tokens, token_lens = batch["tokens"], batch["token_lens"]
    assert torch.equal(token_lens, (lens / tt.SAMPLE_RATE * tt.TOKENS_PER_SECOND).round().long())
    valid = torch.arange(tokens.size(1)) < token_lens[:, None]
    assert torch.all(tokens[valid] > tt.SOS_EOS_ID) and torch.all(tokens[valid] < tt.VOCAB_SIZE)
    assert torch.all(tokens[~valid] == tt.IGNORE_ID)


def test_one_utterance_longer_than_the_budget_still_makes_a_batch():
    assert tt.synthetic_batch(1.0, (2.0, 2.0))["audio_lens"].tolist() == [2 * tt.SAMPLE_RATE]


@pytest.mark.parametrize("encoder", tt.ENCODER_NAMES)
def test_measure_times_each_step_after_warm_up(encoder):
    conf = {"srupp": {"d_model": 32, "num_layers": 2, "attn_dim": 16}, "conformer": {"num_layers": 1, "ffn_dim": 32}}
    model = tt.model_kwargs(tt.SIZES["ci"], encoder, conf.get(encoder, {"d_model": 32, "num_layers": 1}))
    model["d_model"], model["decoder_conf"] = 16, {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32}
    job = {
        "model": model,
        "device": "cpu",
        "precision": "fp32",
        "threads": None,
        "batch_seconds": 1.0,
        "utt_seconds": (0.5, 1.0),
        "steps": 2,
        "warmup_steps": 1,
    }
    result = tt.measure(job)
    assert len(result["times"]) == 2 and all(t > 0 for t in result["times"])
    assert result["peak_memory"] >= 0 and torch.isfinite(torch.tensor(result["loss"]))


def test_measure_goes_through_batches_of_different_shapes_in_turn(monkeypatch):
    batches = tt.synthetic_batches(3.0, (0.5, 1.5), 3)
    assert len({(b["audio"].shape, b["tokens"].shape) for b in batches}) == 3
    assert torch.equal(batches[0]["audio"], tt.synthetic_batch(3.0, (0.5, 1.5))["audio"])
    seen = []
    forward = tt.ASRModel.forward

    def recording(self, audio, audio_lens, tokens, token_lens):
        seen.append(audio.shape)
        return forward(self, audio, audio_lens, tokens, token_lens)

    monkeypatch.setattr(tt.ASRModel, "forward", recording)
    model = tt.model_kwargs(tt.SIZES["ci"], "srupp", {"d_model": 32, "num_layers": 2, "attn_dim": 16})
    model["d_model"], model["decoder_conf"] = 16, {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32}
    job = {"model": model, "device": "cpu", "precision": "fp32", "threads": None, "batch_seconds": 3.0}
    job |= {"utt_seconds": (0.5, 1.5), "steps": 2, "warmup_steps": 1, "batches": 3}
    result = tt.measure(job)
    assert len(result["times"]) == 2 and result["graphs"] is None
    # One warm-up step (batch 0), then the timed steps from batch 0 again.
    assert seen == [b["audio"].shape for b in (batches[0], batches[0], batches[1])]


def test_cuda_graphs_add_a_graphed_srupp_row_on_the_same_batches(monkeypatch):
    # On a CPU GraphedLosses runs its padded computation without recording graphs (0 recorded); on a GPU the same
    # wiring records them. In-process here: _run_isolated would spawn an interpreter per row.
    monkeypatch.setattr(tt, "_run_isolated", tt.measure)
    args = _args(encoders=["srupp", "conformer"], batch_seconds=2.0, utt_seconds=[0.5, 1.0], steps=1, warmup_steps=2)
    args.batches, args.cuda_graphs = 2, True
    lines = tt.train_throughput(args)
    table = lines[next(i for i, line in enumerate(lines) if "params total" in line) :]
    rows = [line.split(" | ")[0] for line in table[2:] if line.startswith("| ")]
    assert rows == ["| srupp", "| srupp, CUDA graphs (0 recorded)", "| conformer"]
    assert any("CUDA graphs for srupp (buckets: 1 s, 16 tokens, 8 rows)" in line for line in lines)


def test_shapes_only_counts_the_padding_to_the_buckets_without_timing(monkeypatch):
    def refuse(job):
        raise AssertionError("--shapes-only must not time anything")

    monkeypatch.setattr(tt, "_run_isolated", refuse)
    args = _args(batch_seconds=3.0, utt_seconds=[0.5, 1.5], batches=3, shapes_only=True, buckets=(1.0, 16, 8))
    row = tt.train_throughput(args)[-2]
    batches = tt.synthetic_batches(3.0, (0.5, 1.5), 3)
    audio = sum(float(b["audio_lens"].sum()) for b in batches) / tt.SAMPLE_RATE
    eager = sum(b["audio"].numel() for b in batches) / tt.SAMPLE_RATE
    # Each batch has at most 8 rows (one edge), its samples rounded up to whole seconds.
    seconds = [math.ceil(b["audio"].size(1) / tt.SAMPLE_RATE) for b in batches]
    assert all(b["audio"].size(0) <= 8 for b in batches)
    bucketed = 8 * sum(seconds)
    padded = f"{bucketed:,.0f} s ({bucketed / eager - 1:+.0%})"
    assert row == f"| 3 | {audio:,.0f} s | {eager:,.0f} s | {padded} | {len(set(seconds))} |"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--cuda-graphs"], "--cuda-graphs needs --device cuda"),
        (["--batches", "0"], "--batches must be at least 1"),
        (["--buckets", "1", "0", "8"], "--buckets needs"),
    ],
)
def test_command_line_refuses_graphs_without_cuda_and_bad_batches(options, message):
    command = [sys.executable, str(SCRIPT), *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr


def test_a_target_out_of_reach_is_an_error():
    with pytest.raises(SystemExit, match="parameters at best"):
        tt.match_width(tt.SIZES["ci"], "srupp", 1000, "total")  # less than the shared parts alone


def test_unmatched_sizes_stop_before_timing(monkeypatch):
    def presets(size, name, target, match):  # the ci presets, but a BLSTM far wider than the others
        return {**size.encoders[name], **({"d_model": 1024} if name == "blstm" else {})}

    monkeypatch.setattr(tt, "match_width", presets)
    args = _args()
    with pytest.raises(SystemExit, match="parameter counts differ"):
        tt.train_throughput(args)


@pytest.mark.slow
def test_command_line_prints_a_row_per_encoder():
    command = [sys.executable, str(SCRIPT), "--size", "ci", "--steps", "1", "--warmup-steps", "0"]
    command += ["--batch-seconds", "1", "--utt-seconds", "1", "1", "--threads", "1"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "encoder" not in line]
    assert [row.split(" | ")[0] for row in rows] == [f"| {name}" for name in tt.ENCODER_NAMES]
    assert "command: python " in out and "spread" in out
