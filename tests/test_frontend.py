"""The frontend: Kaldi agreement of the filterbank, batching, CMVN stats and files, SpecAugment."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from srupp_asr import frontend
from srupp_asr.audio import SAMPLE_RATE, load_audio
from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.frontend import (
    N_MELS,
    WAVEFORM_SCALE,
    Fbank,
    GlobalCMVN,
    SpecAugment,
    compute_cmvn_stats,
    load_cmvn,
    num_frames,
    save_cmvn,
)

# All three implementations compute in float32. On bins within 60 dB of their frame's peak they agree to
# ~3e-4; far weaker bins carry float32 FFT round-off of the strong ones (up to ~5e-3 seen on the chirp,
# between the two references as well), so there only a looser bound is meaningful.
KALDI_TOLERANCE = 1e-3
KALDI_WEAK_BIN_TOLERANCE = 2e-2
STRONG_BIN_RANGE = 60 * math.log(10) / 10  # 60 dB in natural-log power units


def _features(wav: torch.Tensor) -> torch.Tensor:
    feats, frames = Fbank().eval()(wav[None], torch.tensor([wav.numel()]))
    return feats[0, : int(frames[0])]


def _synthetic_audio(seconds: float = 1.5, seed: int = 0) -> torch.Tensor:
    """A chirp over noise with a DC offset and a silent gap: exercises every step of the Kaldi pipeline."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(int(SAMPLE_RATE * seconds), dtype=torch.float64) / SAMPLE_RATE
    wav = 0.3 * torch.sin(2 * math.pi * (100 + 2000 * t) * t) + 0.02 * torch.randn(t.shape, generator=gen) + 0.05
    wav[4000:6000] = 0.0
    return wav.float()


@pytest.fixture(scope="module")
def speech(synthesize_speech) -> torch.Tensor:
    return torch.from_numpy(load_audio(synthesize_speech()))  # the torch frontend's input


def _kaldi_native_fbank(wav: torch.Tensor) -> torch.Tensor:
    knf = pytest.importorskip("kaldi_native_fbank", reason="kaldi-native-fbank is a dev dependency")
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0  # its default is 3e-5, Kaldi's is 1.0; inference uses none
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.mel_opts.num_bins = N_MELS
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(SAMPLE_RATE, (wav * WAVEFORM_SCALE).tolist())
    fbank.input_finished()
    return torch.tensor(np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]))


def _torchaudio_kaldi_fbank(wav: torch.Tensor) -> torch.Tensor:
    return kaldi.fbank(wav[None] * WAVEFORM_SCALE, num_mel_bins=N_MELS, dither=0.0, energy_floor=0.0)


def test_frame_count_follows_kaldi_snip_edges():
    samples = torch.tensor([0, 399, 400, 559, 560, 16000, 16159])
    assert num_frames(samples).tolist() == [0, 0, 1, 1, 2, 98, 99]


def _assert_matches_kaldi(ours: torch.Tensor, ref: torch.Tensor, name: str, overall: float) -> None:
    assert ours.shape == ref.shape, f"{name}: {tuple(ours.shape)} frames vs {tuple(ref.shape)}"
    diff = (ours - ref).abs()
    strong = ref >= ref.max(dim=1, keepdim=True).values - STRONG_BIN_RANGE
    strong_max, overall_max = float(diff[strong].max()), float(diff.max())
    report = f"max abs log-mel difference to {name}: {strong_max:.2e} within 60 dB of the frame peak"
    report += f", {overall_max:.2e} overall"
    assert strong_max <= KALDI_TOLERANCE and overall_max <= overall, report


def test_matches_kaldi_native_fbank_on_speech(speech):
    ours = _features(speech)
    assert ours.shape == (num_frames(torch.tensor(speech.numel())), N_MELS)
    _assert_matches_kaldi(ours, _kaldi_native_fbank(speech), "kaldi-native-fbank", overall=KALDI_TOLERANCE)


def test_matches_torchaudio_kaldi_fbank_on_speech(speech):
    ours = _features(speech)
    _assert_matches_kaldi(ours, _torchaudio_kaldi_fbank(speech), "torchaudio.compliance.kaldi", overall=KALDI_TOLERANCE)


@pytest.mark.parametrize("seed", [0, 2])
def test_matches_both_kaldi_references_on_a_chirp_with_dc_and_silence(seed):
    wav = _synthetic_audio(seed=seed)
    ours = _features(wav)
    _assert_matches_kaldi(ours, _torchaudio_kaldi_fbank(wav), "torchaudio", overall=KALDI_WEAK_BIN_TOLERANCE)
    _assert_matches_kaldi(ours, _kaldi_native_fbank(wav), "kaldi-native-fbank", overall=KALDI_WEAK_BIN_TOLERANCE)
    # The digital silence hits the log floor exactly as Kaldi's does.
    assert float(ours.min()) == pytest.approx(math.log(torch.finfo(torch.float32).eps))


def test_batch_of_different_lengths_matches_each_utterance_alone():
    utterances = [_synthetic_audio(1.2, seed=1), _synthetic_audio(0.43, seed=2), torch.rand(399) - 0.5]
    lengths = torch.tensor([u.numel() for u in utterances])
    batch = torch.full((3, int(lengths.max())), 0.9)  # loud padding: it must not reach any valid frame
    for i, u in enumerate(utterances):
        batch[i, : u.numel()] = u
    feats, frames = Fbank().eval()(batch, lengths)
    assert frames.tolist() == num_frames(lengths).tolist() == [118, 41, 0]
    assert feats.shape == (3, 118, N_MELS)
    for i, u in enumerate(utterances):
        n = int(frames[i])
        torch.testing.assert_close(feats[i, :n], _features(u), atol=1e-5, rtol=0)
        assert torch.count_nonzero(feats[i, n:]) == 0


def test_input_shorter_than_one_window_gives_no_frames():
    feats, frames = Fbank()(torch.zeros(2, 300), torch.tensor([300, 120]))
    assert feats.shape == (2, 0, N_MELS) and frames.tolist() == [0, 0]


def test_dither_applies_only_in_training_mode():
    wav = _synthetic_audio(0.5)[None]
    lengths = torch.tensor([wav.size(1)])
    plain = Fbank().eval()(wav, lengths)[0]
    dithered = Fbank(dither=1.0)
    torch.testing.assert_close(dithered.eval()(wav, lengths)[0], plain, atol=0, rtol=0)
    torch.manual_seed(0)
    noisy = dithered.train()(wav, lengths)[0]
    change = (noisy - plain).abs()
    # One 16-bit step of noise barely moves loud bins but fills in the silent gap (log floor ~ -15.9).
    assert 0 < float(change.median()) < 0.01
    assert float(noisy.min()) > float(plain.min()) + 5


def test_mixed_precision_does_not_reach_the_filterbank():
    wav = _synthetic_audio(0.5)[None]
    lengths = torch.tensor([wav.size(1)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        feats = Fbank()(wav, lengths)[0]
    assert feats.dtype == torch.float32
    torch.testing.assert_close(feats, Fbank()(wav, lengths)[0], atol=0, rtol=0)


def test_half_precision_model_still_computes_float32_features():
    wav = _synthetic_audio(0.5)[None]
    lengths = torch.tensor([wav.size(1)])
    feats = Fbank().half()(wav.half(), lengths)[0]
    assert feats.dtype == torch.float32
    torch.testing.assert_close(feats, Fbank()(wav.half().float(), lengths)[0], atol=0, rtol=0)


def test_fbank_constants_stay_out_of_the_state_dict():
    assert dict(Fbank().state_dict()) == {}


def test_cmvn_normalises_valid_frames_and_keeps_padding_zero():
    mean, std = torch.linspace(-5, 5, N_MELS), torch.linspace(0.5, 4, N_MELS)
    cmvn = GlobalCMVN(mean, std)
    feats = mean + std * torch.randn(2, 30, N_MELS, generator=torch.Generator().manual_seed(0))
    out = cmvn(feats, torch.tensor([30, 12]))
    torch.testing.assert_close(out[0], (feats[0] - mean) / std)
    torch.testing.assert_close(out[1, :12], (feats[1, :12] - mean) / std)
    assert torch.count_nonzero(out[1, 12:]) == 0


def test_cmvn_stats_travel_in_the_state_dict():
    cmvn = GlobalCMVN(torch.full((N_MELS,), 3.0), torch.full((N_MELS,), 2.0))
    state = cmvn.state_dict()
    assert set(state) == {"mean", "istd"}
    fresh = GlobalCMVN()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.mean, torch.full((N_MELS,), 3.0)) and torch.equal(fresh.istd, torch.full((N_MELS,), 0.5))


def test_cmvn_floors_tiny_std():
    cmvn = GlobalCMVN(torch.zeros(N_MELS), torch.zeros(N_MELS))
    assert torch.equal(cmvn.istd, torch.full((N_MELS,), 1 / frontend.STD_FLOOR))


def _cuts(tmp_path, waves: list[tuple[torch.Tensor, int]]):
    from lhotse import CutSet, Recording

    cuts = []
    for i, (wav, rate) in enumerate(waves):
        path = tmp_path / f"u{i}.wav"
        sf.write(path, wav.numpy(), rate, subtype="FLOAT")
        cuts.append(Recording.from_file(path, recording_id=f"u{i}").to_cut())
    return CutSet.from_cuts(cuts)


def test_compute_cmvn_stats_equals_stats_over_all_frames(tmp_path):
    waves = [(_synthetic_audio(1.0, seed=3), SAMPLE_RATE), (0.5 * _synthetic_audio(0.7, seed=4), 8000)]
    cuts = _cuts(tmp_path, waves)
    all_frames = torch.cat([_features(torch.from_numpy(load_audio(tmp_path / f"u{i}.wav"))) for i in range(2)]).double()
    mean, std = compute_cmvn_stats(cuts)
    assert mean.dtype == std.dtype == torch.float32 and mean.shape == std.shape == (N_MELS,)
    torch.testing.assert_close(mean.double(), all_frames.mean(0), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(std.double(), all_frames.std(0, correction=0), atol=1e-5, rtol=1e-5)
    first_mean, _ = compute_cmvn_stats(cuts, max_cuts=1)
    torch.testing.assert_close(first_mean.double(), all_frames[:98].mean(0), atol=1e-5, rtol=1e-6)


def test_compute_cmvn_stats_without_frames_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no audio frames"):
        compute_cmvn_stats(_cuts(tmp_path, [(torch.zeros(200), SAMPLE_RATE)]))


def test_cmvn_file_round_trips_exactly(tmp_path):
    mean, std = torch.randn(N_MELS), torch.rand(N_MELS) + 0.1
    save_cmvn(tmp_path / "sub" / "cmvn.json", mean, std)
    loaded_mean, loaded_std = load_cmvn(tmp_path / "sub" / "cmvn.json")
    assert torch.equal(loaded_mean, mean) and torch.equal(loaded_std, std)


def test_save_cmvn_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "cmvn.json"
    save_cmvn(path, torch.zeros(4), torch.ones(4))
    save_cmvn(path, torch.ones(4), torch.full((4,), 2.0))
    assert json.loads(path.read_text()) == {"mean": [1.0] * 4, "std": [2.0] * 4}
    assert [p.name for p in tmp_path.iterdir()] == ["cmvn.json"]


def test_failed_save_keeps_the_old_cmvn_file(tmp_path, monkeypatch):
    path = tmp_path / "cmvn.json"
    save_cmvn(path, torch.zeros(4), torch.ones(4))

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(frontend.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_cmvn(path, torch.ones(4), torch.ones(4))
    assert json.loads(path.read_text())["mean"] == [0.0] * 4
    assert [p.name for p in tmp_path.iterdir()] == ["cmvn.json"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "Expecting property name"),
        ('{"mean": [0.0]}', "'mean' and 'std'"),
        ('{"mean": [0.0, 1.0], "std": [1.0]}', "equally long"),
        ('{"mean": ["a"], "std": [1.0]}', "lists of numbers"),
        ('{"mean": [0.0], "std": [-1.0]}', "non-negative"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_cmvn_file_is_a_user_error(tmp_path, content, reason):
    path = tmp_path / "cmvn.json"
    path.write_text(content)
    with pytest.raises(UserError) as info:
        load_cmvn(path)
    assert str(info.value).startswith(f"{path}: not a CMVN stats file (") and reason in str(info.value)


def test_missing_cmvn_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"cmvn\.json: no such file"):
        load_cmvn(tmp_path / "cmvn.json")


# SpecAugment ---------------------------------------------------------------------------------------------

PAD = 7.0  # a padding value no mask or warp produces, to see that padding is left alone


def _padded_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    feats = torch.full((len(lengths), max(lengths), N_MELS), PAD)
    for i, n in enumerate(lengths):
        feats[i, :n] = torch.rand(n, N_MELS, generator=gen) + 1.0  # never 0, so 0 means masked
    return feats, torch.tensor(lengths)


def test_spec_augment_is_the_identity_in_eval_mode():
    feats, lengths = _padded_batch([50, 20])
    assert SpecAugment().eval()(feats, lengths) is feats


def test_masks_are_whole_bands_and_spans_and_padding_is_untouched():
    torch.manual_seed(0)
    augment = SpecAugment(time_warp=0).train()
    lengths_list = [400, 237, 60, 8]
    for seed in range(20):
        feats, lengths = _padded_batch(lengths_list, seed)
        out = augment(feats, lengths)
        for i, n in enumerate(lengths_list):
            valid, orig = out[i, :n], feats[i, :n]
            masked = valid == 0
            # Every element is either kept exactly or masked.
            assert torch.equal(valid[~masked], orig[~masked])
            bands, spans = masked.all(dim=0), masked.all(dim=1)
            # A masked element lies in a fully masked band or a fully masked time span.
            assert torch.equal(masked, bands[None, :] | spans[:, None])
            if not spans.all():
                assert int(bands.sum()) <= 2 * 27
            max_spans = min(10, math.ceil(0.04 * n))
            assert int(spans.sum()) <= max_spans * math.floor(0.05 * n)
            assert torch.equal(out[i, n:], feats[i, n:])


def test_time_masks_scale_with_utterance_length():
    torch.manual_seed(0)
    augment = SpecAugment(time_warp=0, freq_masks=0).train()
    lengths = [1000] * 50 + [40] * 50 + [19] * 50
    feats, lengths_t = _padded_batch(lengths)
    masked = (augment(feats, lengths_t) == 0).all(dim=2).sum(dim=1).float()
    long, short, tiny = masked[:50], masked[50:100], masked[100:]
    # 10 masks of 0..50 frames: ~25% masked on average, never over half.
    assert 0.15 * 1000 < float(long.mean()) < 0.35 * 1000 and float(long.max()) <= 500
    # 2 masks (ceil(0.04 * 40)) of 0..2 frames.
    assert float(short.max()) <= 4 and float(short.sum()) > 0
    # Width 0.05 * 19 rounds down to 0: nothing masked.
    assert float(tiny.sum()) == 0


def test_time_warp_keeps_order_and_padding():
    torch.manual_seed(0)
    warp_only = SpecAugment(freq_masks=0, max_time_masks=0).train()
    lengths = [120, 64, 10, 11]
    ramp = torch.arange(120, dtype=torch.float32)[:, None].expand(120, N_MELS)
    feats = torch.full((4, 120, N_MELS), PAD)
    for i, n in enumerate(lengths):
        feats[i, :n] = ramp[:n]
    changed = 0
    for _ in range(10):
        out = warp_only(feats, torch.tensor(lengths))
        for i, n in enumerate(lengths):
            steps = out[i, 1:n, 0] - out[i, : n - 1, 0]
            assert bool((steps >= -1e-5).all()), "a warp must not reorder frames"
            assert float(out[i, 0, 0]) == 0.0 and float(out[i, n - 1, 0]) == pytest.approx(n - 1)
            # Columns are warped together, so each frame stays one consistent vector.
            assert torch.equal(out[i, :n], out[i, :n, :1].expand(n, N_MELS))
            assert torch.equal(out[i, n:], feats[i, n:])
        changed += int(not torch.equal(out[0, :120], feats[0, :120]))
        # 10 frames is too short for a window of 5 on each side: left alone.
        assert torch.equal(out[2], feats[2])
    assert changed >= 8  # w = 0 is one of 10 possible shifts


def test_spec_augment_options_must_be_non_negative():
    with pytest.raises(ValueError, match="non-negative"):
        SpecAugment(freq_width=-1)


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_frontend_audit.py
# Audit of the frontend, the Noam schedule and the manifest check against references written from their
# definitions: SpecAugment (Park et al. 2019, per utterance as ESPnet's time warp), the Noam formula, lhotse's own
# validation of supervisions.


# SpecAugment (checked clean; these pin the reference behaviour) -----------------------------------------


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
def test_time_mask_widths_cover_zero_to_ratio_times_length():
    augment = SpecAugment(time_warp=0, freq_masks=0, max_time_masks=1, time_masks_per_frame=1.0).train()
    torch.manual_seed(0)
    feats = torch.ones(3000, 100, 4)
    widths = (augment(feats, torch.full((3000,), 100)) == 0).all(dim=2).sum(dim=1)
    # One mask of 0..floor(0.05 * 100) = 0..5 frames, each width about 1/6 of the time.
    counts = torch.bincount(widths, minlength=6)
    assert counts.numel() == 6 and int(counts.min()) > 3000 / 6 * 0.8


@pytest.mark.reference
def test_cmvn_refuses_stats_of_another_number_of_bins():
    with pytest.raises(ValueError, match=r"expected mean and std of shape \(80,\)"):
        GlobalCMVN().set_stats(torch.zeros(40), torch.ones(40))


@pytest.mark.reference
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
