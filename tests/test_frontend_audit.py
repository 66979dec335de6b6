"""Audit of the frontend, the Noam schedule and the manifest check against references written from their
definitions: SpecAugment (Park et al. 2019, per utterance as ESPnet's time warp), the Noam formula, lhotse's own
validation of supervisions."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.frontend import N_MELS, WAVEFORM_SCALE, GlobalCMVN, SpecAugment, load_cmvn
from srupp_asr.manifest_check import check_cuts_manifest
from srupp_asr.schedulers import NoamLR

# Manifest check ------------------------------------------------------------------------------------------


@pytest.fixture
def audio(tmp_path: Path) -> Path:
    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(16000, dtype=np.float32), 16000)
    return path


def _cut(audio: Path, name: str, start: float = 0.0, duration: float = 1.0, sup: dict | None = None) -> dict:
    """A MonoCut dict of the 1 s ``audio`` with one supervision (``sup`` merged into it)."""
    supervision = {"id": name, "recording_id": "a", "start": 0.0, "duration": duration, "text": "hello", **(sup or {})}
    return {
        "id": name,
        "start": start,
        "duration": duration,
        "channel": 0,
        "supervisions": [supervision],
        "recording": {
            "id": "a",
            "sources": [{"type": "file", "channels": [0], "source": str(audio)}],
            "sampling_rate": 16000,
            "num_samples": 16000,
            "duration": 1.0,
            "channel_ids": [0],
        },
        "type": "MonoCut",
    }


def _manifest(path: Path, cuts: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(c) + "\n" for c in cuts)
    return path


@pytest.mark.parametrize("duration", [-1.0, 0.0])
def test_a_supervision_without_a_positive_duration_is_refused(audio, tmp_path, duration):
    # Was: the check passed (returned 2) although lhotse's validate_supervision asserts duration > 0.
    path = _manifest(tmp_path / "cuts.jsonl.gz", [_cut(audio, "a"), _cut(audio, "b", sup={"duration": duration})])
    with pytest.raises(UserError) as err:
        check_cuts_manifest(path)
    assert str(err.value) == f"{path}:2: cut b: supervision b: 'duration' must be a positive number, not {duration}"


@pytest.mark.parametrize(
    ("sup", "span"), [({"start": 0.7, "duration": 0.2}, "0.700 s to 0.900 s"), ({"start": -0.5}, "-0.500 s to 0.000 s")]
)
def test_a_supervision_outside_its_cut_is_refused(audio, tmp_path, sup, span):
    # Was: the check passed (returned 2), and training read the text "hello" as the transcript of the 0.5 s of
    # audio of cut b, which does not hold it (data.cut_text joins every supervision's text whatever its times).
    bad = _cut(audio, "b", start=0.5, duration=0.5, sup=sup)
    path = _manifest(tmp_path / "cuts.jsonl.gz", [_cut(audio, "a"), bad])
    with pytest.raises(UserError) as err:
        check_cuts_manifest(path)
    assert str(err.value) == f"{path}:2: cut b: supervision b spans {span}, outside its cut (0 to 0.500 s)"


def test_a_supervision_partly_inside_its_cut_still_passes(audio, tmp_path):
    # lhotse's truncate keeps such supervisions by default (keep_excessive_supervisions=True).
    partly = _cut(audio, "b", duration=0.5, sup={"start": 0.3, "duration": 0.7})
    assert check_cuts_manifest(_manifest(tmp_path / "cuts.jsonl.gz", [partly])) == 1


# SpecAugment (checked clean; these pin the reference behaviour) -----------------------------------------


def test_spec_augment_gives_an_utterance_the_same_result_alone_and_padded():
    augment = SpecAugment().train()
    feats = torch.rand(1, 300, N_MELS, generator=torch.Generator().manual_seed(1)) + 1.0
    padded = torch.cat([feats, torch.full((1, 600, N_MELS), 7.0)], dim=1)
    for seed in range(5):
        torch.manual_seed(seed)
        alone = augment(feats, torch.tensor([300]))
        torch.manual_seed(seed)
        batched = augment(padded, torch.tensor([300]))
        assert torch.equal(batched[:, :300], alone) and torch.equal(batched[:, 300:], padded[:, 300:])
        assert not torch.equal(alone, feats)


def test_time_warp_is_the_papers_piecewise_linear_map():
    """On a ramp the output is the source position: (0, 0), (c + w, c), (L - 1, L - 1), W <= c < L - W, |w| <= W."""
    window, length = 5, 60
    warp_only = SpecAugment(time_warp=window, freq_masks=0, max_time_masks=0).train()
    ramp = torch.arange(length, dtype=torch.float32)[None, :, None].expand(1, length, N_MELS).contiguous()
    torch.manual_seed(0)
    moved = 0
    for _ in range(30):
        out = warp_only(ramp, torch.tensor([length]))[0, :, 0].double()
        bends = (out[2:] - 2 * out[1:-1] + out[:-2]).abs() > 1e-4
        if not bends.any():
            assert torch.allclose(out, ramp[0, :, 0].double(), atol=1e-5)  # w = 0
            continue
        moved += 1
        assert int(bends.sum()) == 1
        dest = int(bends.nonzero()) + 1
        center = float(out[dest])
        assert center == pytest.approx(round(center), abs=1e-4)
        center = round(center)
        assert window <= center < length - window and abs(dest - center) <= window
        expected = np.interp(np.arange(length), [0, dest, length - 1], [0, center, length - 1])
        np.testing.assert_allclose(out.numpy(), expected, atol=1e-4)
    assert moved >= 20


def test_time_mask_widths_cover_zero_to_ratio_times_length():
    augment = SpecAugment(time_warp=0, freq_masks=0, max_time_masks=1, time_masks_per_frame=1.0).train()
    torch.manual_seed(0)
    feats = torch.ones(3000, 100, 4)
    widths = (augment(feats, torch.full((3000,), 100)) == 0).all(dim=2).sum(dim=1)
    # One mask of 0..floor(0.05 * 100) = 0..5 frames, each width about 1/6 of the time.
    counts = torch.bincount(widths, minlength=6)
    assert counts.numel() == 6 and int(counts.min()) > 3000 / 6 * 0.8


# Noam schedule and CMVN (checked clean) --------------------------------------------------------------------


def test_noam_with_one_warmup_step_starts_at_the_peak_and_decays():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, warmup_steps=1)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1.0, 1 / math.sqrt(2), 1 / math.sqrt(3), 0.5])


def test_noam_resumed_mid_warmup_continues_the_ramp():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, warmup_steps=100)
    for _ in range(30):
        optimizer.step()
        scheduler.step()
    resumed_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    resumed = NoamLR(resumed_optimizer, warmup_steps=100)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(31 / 100)
    resumed_optimizer.step()
    resumed.step()
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(32 / 100)


def test_cmvn_refuses_stats_of_another_number_of_bins():
    with pytest.raises(ValueError, match=r"expected mean and std of shape \(80,\)"):
        GlobalCMVN().set_stats(torch.zeros(40), torch.ones(40))


def test_cmvn_command_computes_stats_for_the_models_number_of_bins(tmp_path, capsys):
    # Was: `srupp-asr cmvn` always computed 80 bins ("unrecognized arguments: --n-mels", exit 2), and a model with
    # model.n_mels 40 refused its only stats: "CMVN stats have 80 dimensions, the model has n_mels=40".
    from lhotse import CutSet, Recording

    gen = torch.Generator().manual_seed(0)
    t = torch.arange(16000, dtype=torch.float64) / 16000
    wav = (0.3 * torch.sin(2 * math.pi * (200 + 1500 * t) * t) + 0.02 * torch.randn(16000, generator=gen)).float()
    sf.write(tmp_path / "u.wav", wav.numpy(), 16000, subtype="FLOAT")
    cuts = tmp_path / "cuts.jsonl.gz"
    CutSet.from_cuts([Recording.from_file(tmp_path / "u.wav", recording_id="u").to_cut()]).to_file(cuts)

    assert main(["cmvn", str(cuts), "--out", str(tmp_path / "cmvn.json"), "--n-mels", "40"]) == 0
    mean, std = load_cmvn(tmp_path / "cmvn.json")
    # Reference: torchaudio's Kaldi fbank with 40 bins, two-pass float64 statistics.
    frames = kaldi.fbank(wav[None] * WAVEFORM_SCALE, num_mel_bins=40, dither=0.0, energy_floor=0.0).double()
    torch.testing.assert_close(mean.double(), frames.mean(0), atol=2e-3, rtol=0)
    torch.testing.assert_close(std.double(), frames.std(0, correction=0), atol=2e-3, rtol=0)
    GlobalCMVN(num_features=40).set_stats(mean, std)

    capsys.readouterr()
    assert main(["cmvn", str(cuts), "--out", str(tmp_path / "bad.json"), "--n-mels", "0"]) == 2
    assert capsys.readouterr().err == "srupp-asr cmvn: error: --n-mels must be at least 1, got 0\n"
