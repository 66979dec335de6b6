"""Long recordings without a model: chunk plans, the energy VAD, and joining the words of overlapping chunks."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from srupp_asr.longform import (
    Chunk,
    Loudness,
    energies_from_blocks,
    energy_threshold_db,
    find_silences,
    frame_energies_db,
    merge_chunk_words,
    plan_chunks,
    shift_words,
    silences_from_energies,
)


@dataclass
class W:
    text: str
    start: float
    end: float
    confidence: float = 1.0


def _covers(chunks, total):
    assert chunks[0].start == 0 and chunks[-1].end == total
    for a, b in itertools.pairwise(chunks):
        assert b.start <= a.end, "a gap between chunks"
        assert b.start > a.start


def test_a_recording_within_the_budget_is_one_chunk():
    assert plan_chunks(100, 100, 10) == [Chunk(0, 100)]
    assert plan_chunks(5, 100, 10, silences=[(1, 2)]) == [Chunk(0, 5)]


@pytest.mark.parametrize(("total", "max_len", "overlap"), [(1000, 300, 50), (1001, 300, 0), (10_000, 997, 100)])
def test_without_loudness_overlapping_chunks_are_as_long_as_the_budget_and_overlap_as_asked(total, max_len, overlap):
    chunks = plan_chunks(total, max_len, overlap)
    _covers(chunks, total)
    assert all(c.end - c.start == max_len for c in chunks[:-2]) and max(c.end - c.start for c in chunks) <= max_len
    assert all(a.end - b.start == overlap for a, b in itertools.pairwise(chunks[:-1]))
    assert chunks[-2].end - chunks[-1].start >= overlap
    assert chunks[-1].end - chunks[-1].start >= max_len // 2  # no sliver at the end


def test_chunks_start_on_the_grid_and_keep_budget_and_overlap():
    chunks = plan_chunks(10_000, 997, 100, grid=64)
    _covers(chunks, 10_000)
    assert all(c.start % 64 == 0 for c in chunks)
    assert all(c.end - c.start <= 997 for c in chunks) and all(
        a.end - b.start >= 100 for a, b in itertools.pairwise(chunks)
    )
    # VAD cuts too: the middle of a silence (150, 251) moved back onto the grid; no silence past 248, so the rest
    # is overlapping chunks, as late as the budget allows without loudness.
    assert plan_chunks(900, 300, 50, [(140, 160), (240, 262)], grid=8) == [
        Chunk(0, 248),
        Chunk(248, 548),
        Chunk(496, 796),
        Chunk(744, 900),
    ]
    with pytest.raises(ValueError):
        plan_chunks(100, 10, 0, grid=0)


def _loudness(levels: list[tuple[int, float]]) -> Loudness:
    """10-ms frames (160 samples) at the given ``(frames, dB)`` levels, in order."""
    return Loudness(np.concatenate([np.full(n, db) for n, db in levels]), 160)


def test_the_quietest_moment_is_the_middle_of_the_quietest_pause_and_the_latest_of_equals():
    # Speech at -20 dB, pauses at frames 100-150 (-60 dB) and 300-340 (-90 dB), a -90.5 dB pause at 600-640.
    loud = _loudness([(100, -20), (50, -60), (150, -20), (40, -90), (260, -20), (40, -90.5), (160, -20)])
    # Windows of 20 frames lie wholly in the -90 dB pause with centres at frames 310-330: its middle, 320.
    assert loud.quietest(0, 500 * 160) == 320 * 160
    assert loud.quietest(0, 250 * 160) == 125 * 160  # the -60 dB pause is the quietest within reach
    assert loud.quietest(0, 1000 * 160) == 620 * 160  # within 1 dB of each other: the later one
    # Uniform loudness: the middle of the range; no whole window centred in it (the recording's edge): its end.
    assert loud.quietest(20 * 160, 60 * 160) == 40 * 160
    assert loud.quietest(0, 5 * 160) == 5 * 160
    assert Loudness(np.zeros(3), 160).quietest(0, 480) == 480


def test_overlapping_chunks_start_and_end_at_the_quietest_moments_within_reach():
    # Chunks of up to 4 s overlapping by at least 1 s; pauses (-90 dB) in speech (-20 dB) at 2.5-2.9 s and 5-5.2 s.
    loud = _loudness([(250, -20), (40, -90), (210, -20), (20, -90), (480, -20)])
    chunks = plan_chunks(1000 * 160, 400 * 160, 100 * 160, loudness=loud)
    _covers(chunks, 1000 * 160)
    first, second = chunks[0], chunks[1]
    assert second.start == 270 * 160  # the first pause, in the first chunk's second half (2-3 s)
    assert first.end == 385 * 160  # no pause in 3.7-4 s: the middle of what is within reach
    assert chunks[2].start == 510 * 160  # the second pause, within 4.7-5.7 s
    for a, b in itertools.pairwise(chunks):
        assert b.start >= a.start + 200 * 160 and a.end - b.start >= 100 * 160  # progress, and the overlap kept
    assert max(c.end - c.start for c in chunks) <= 400 * 160


@pytest.mark.parametrize("seed", range(5))
def test_quiet_edged_chunks_cover_any_recording_within_budget_and_overlap(seed):
    rng = np.random.default_rng(seed)
    frames = int(rng.integers(500, 5000))
    loud = Loudness(rng.uniform(-100, 0, frames), 160)
    total = frames * 160 + int(rng.integers(0, 160))
    max_len, overlap = int(rng.integers(100, 600)) * 160, int(rng.integers(0, 50)) * 160
    chunks = plan_chunks(total, max_len, overlap, loudness=loud)
    _covers(chunks, total)
    assert max(c.end - c.start for c in chunks) <= max_len
    assert all(a.end - b.start >= overlap for a, b in itertools.pairwise(chunks))
    assert len(chunks) <= 2 * total / max_len + 2  # each chunk moves on by at least half the budget


def test_vad_cuts_in_the_middle_of_the_latest_silence_that_fits():
    # Silences centred at 150, 250, 480, 700; chunks up to 300.
    silences = [(140, 160), (240, 260), (470, 490), (690, 710)]
    chunks = plan_chunks(900, 300, 50, silences)
    assert chunks == [Chunk(0, 250), Chunk(250, 480), Chunk(480, 700), Chunk(700, 900)]


def test_vad_prefers_a_cut_past_half_the_budget_and_falls_back_to_an_earlier_one():
    # Only silence within reach of the first chunk is at 50 (< half of 300): still better than cutting speech.
    assert plan_chunks(500, 300, 20, [(40, 60)])[0] == Chunk(0, 50)


def test_a_long_stretch_without_silence_gets_overlapping_chunks():
    # Speech from 100 to 1000 without a pause; chunks of 300 overlapping by 30.
    chunks = plan_chunks(1200, 300, 30, [(90, 110), (990, 1010)])
    _covers(chunks, 1200)
    assert chunks[0] == Chunk(0, 100)
    middle = [c for c in chunks if c.start >= 100 and c.end <= 1000]
    assert middle[0].start == 100 and middle[-1].end == 1000
    assert all(a.end - b.start == 30 for a, b in itertools.pairwise(middle[:-1]))
    assert middle[-2].end - middle[-1].start >= 30
    assert chunks[-1] == Chunk(1000, 1200)
    assert max(c.end - c.start for c in chunks) <= 300


def test_bad_budgets_are_refused():
    with pytest.raises(ValueError):
        plan_chunks(100, 0, 0)
    with pytest.raises(ValueError):
        plan_chunks(100, 10, 10)


def test_energies_are_db_of_full_scale_with_a_floor():
    frame = 160
    wav = np.concatenate([np.zeros(frame), np.full(frame, 1.0), np.full(frame, 0.1), np.zeros(50)])
    np.testing.assert_allclose(frame_energies_db(wav, frame), [-100.0, 0.0, -20.0])


def test_silences_are_runs_of_quiet_frames_long_enough():
    energies = np.array([-20.0] * 5 + [-90.0] * 3 + [-20.0] * 2 + [-90.0] * 30 + [-20.0] * 4 + [-90.0] * 6)
    # Threshold between floor and speech; runs of at least 4 frames count: 30 in the middle and 6 at the end.
    assert find_silences(energies, frame_samples=10, min_silence_frames=4) == [(100, 400), (440, 500)]
    assert find_silences(energies, frame_samples=10, min_silence_frames=4, threshold_db=-95.0) == []


def test_a_quiet_speaker_below_the_recordings_threshold_is_not_a_silence_but_its_pauses_are():
    # Was: a speaker 40 dB quieter than the loudest lies wholly below the recording's threshold (-50 dB here), so
    # the whole stretch was one silence: --vad skipped the chunks inside it (their words lost) and cut in its words.
    quiet_speech = ([-62.0] * 20 + [-100.0] * 40) * 3  # a quiet speaker's words and 0.4 s pauses
    energies = np.array([-20.0] * 50 + [-100.0] * 40 + quiet_speech + [-100.0] * 40)
    assert energy_threshold_db(energies) == pytest.approx(-50.0)
    # frames 50-89 silent, quiet words at 90, 150 and 210 (20 frames each), 270-309 silent again: the silences are
    # the pauses around the quiet words, not frames 50-309 as one
    found = find_silences(energies, frame_samples=10, min_silence_frames=30)
    assert found == [(500, 900), (1100, 1500), (1700, 2100), (2300, 3100)]
    # Steady noise in a stretch (a spread of 2 dB) holds no sound of its own: still one silence.
    noisy = np.array([-20.0] * 50 + [-71.0, -70.0, -69.0] * 30 + [-20.0] * 50)
    assert find_silences(noisy, frame_samples=10, min_silence_frames=30) == [(500, 1400)]


def test_a_silence_at_the_end_runs_over_the_last_partial_frame():
    # Was: it ended at the last whole frame, so the last chunk (to the last sample) was never inside it: --vad
    # decoded that chunk of silence, where the built-in model makes up a word.
    wav = np.concatenate([np.full(16000, 0.1), np.zeros(16000 + 50)])
    energies, total = energies_from_blocks([wav[:8000], wav[8000:]], 160)
    assert total == len(wav)
    assert silences_from_energies(energies, total, 160, 30) == [(16000, 32050)]


def test_threshold_sits_between_noise_floor_and_speech():
    energies = np.array([-60.0] * 50 + [-20.0] * 50)
    assert energy_threshold_db(energies) == pytest.approx(-40.0)  # halfway from -60 to -20
    # Digital silence (-100 dB) counts as 60 dB below the speech, so the threshold stays out of faint noise.
    assert energy_threshold_db(np.array([-100.0] * 50 + [-10.0] * 50)) == pytest.approx(-40.0)
    assert energy_threshold_db(np.full(10, -30.0)) == pytest.approx(-24.0)  # at least the margin above the floor


def test_energies_from_blocks_equal_those_of_the_whole_signal():
    rng = np.random.default_rng(0)
    speech = 0.3 * rng.standard_normal(16000)
    wav = np.concatenate([speech, np.zeros(8000), speech, 0.001 * rng.standard_normal(12000), speech])
    whole = find_silences(frame_energies_db(wav, 160), 160, 30)
    blocks = [wav[i : i + 3200] for i in range(0, len(wav), 3200)]
    energies, total = energies_from_blocks(blocks, 160)
    np.testing.assert_array_equal(energies, frame_energies_db(wav, 160))
    assert silences_from_energies(energies, total, 160, 30) == whole
    assert [(round(a / 160), round(b / 160)) for a, b in whole] == [(100, 150), (250, 325)]


def test_shift_words_moves_copies():
    words = [W("a", 0.5, 1.0)]
    assert shift_words(words, 10.0) == [W("a", 10.5, 11.0)]
    assert words == [W("a", 0.5, 1.0)]


def _texts(words):
    return [w.text for w in words]


def test_touching_chunks_are_concatenated():
    merged = merge_chunk_words([(0, 10), (10, 20)], [[W("a", 1, 2), W("b", 9, 9.9)], [W("c", 10.2, 11)]])
    assert _texts(merged) == ["a", "b", "c"]


def test_overlap_takes_each_word_from_the_chunk_where_it_is_farther_from_the_edge():
    # Chunks [0, 12) and [8, 20): the overlap [8, 12) has its midpoint at 10.
    first = [W("one", 1, 2), W("two", 8.2, 8.8), W("three", 9.2, 9.8), W("garbled", 11.5, 11.9)]
    second = [W("edge", 8.0, 8.3), W("three", 9.25, 9.8), W("four", 10.3, 10.9), W("five", 15, 16)]
    merged = merge_chunk_words([(0, 12), (8, 20)], [first, second])
    assert _texts(merged) == ["one", "two", "three", "four", "five"]
    assert merged[2] is first[2]


def test_a_word_on_the_midpoint_kept_by_both_sides_appears_once():
    # "word" centred at 9.9 in the first chunk and 10.1 in the second: both would keep it.
    first = [W("a", 7.0, 7.5), W("word", 9.6, 10.2)]
    second = [W("word", 9.8, 10.4), W("b", 12.0, 12.5)]
    merged = merge_chunk_words([(0, 12), (8, 20)], [first, second])
    assert _texts(merged) == ["a", "word", "b"]
    # The first chunk's copy (centre 9.9, 2.1 s from its edge at 12) beats the second's (2.1 s from 8): a tie
    # goes to the earlier chunk; move the second's copy deeper and it wins.
    assert merged[1] is first[1]
    later = [W("word", 9.9, 10.5), W("b", 12.0, 12.5)]
    merged = merge_chunk_words([(0, 12), (8, 20)], [[W("a", 7.0, 7.5), W("word", 9.7, 10.2)], later])
    assert _texts(merged) == ["a", "word", "b"]
    assert merged[1] is later[0]


def test_a_word_on_the_midpoint_dropped_by_both_sides_is_taken_back():
    # The first chunk puts "word" after the midpoint, the second before it: neither would keep it.
    first = [W("a", 7.0, 7.5), W("word", 9.85, 10.35)]
    second = [W("word", 9.65, 10.15), W("b", 12.0, 12.5)]
    merged = merge_chunk_words([(0, 12), (8, 20)], [first, second])
    assert _texts(merged) == ["a", "word", "b"]


def test_merge_checks_its_arguments():
    assert merge_chunk_words([], []) == []
    with pytest.raises(ValueError):
        merge_chunk_words([(0, 1)], [])


@pytest.mark.parametrize("silences", [[], [(40, 60)]], ids=["no silence", "silence early only"])
def test_a_plan_ending_in_speech_has_no_empty_last_chunk(silences):
    # No silence within reach of the end: the overlapping stretch reaches it, and nothing empty follows.
    chunks = plan_chunks(1000, 300, 30, silences)
    _covers(chunks, 1000)
    assert all(c.end > c.start for c in chunks) and chunks[-1].end == 1000


def test_joint_by_default_decodes_a_long_recording_in_pieces_cut_at_pauses(overfit_model_dir, tmp_path, monkeypatch):
    """The default mode (joint) decodes a recording longer than a piece in pieces of at most
    ``ATTENTION_PIECE_SECONDS`` cut in its pauses, several at a time: each cut lies in a pause, the text is that
    of each piece transcribed as a file of its own, and the progress bar advances piece by piece, in seconds of
    audio. (The overfit model knows single utterances only, so the text itself is not theirs.)"""
    import soundfile as sf
    import tqdm

    from srupp_asr.audio import SAMPLE_RATE, load_audio
    from srupp_asr.decoding.batch import ATTENTION_PIECE_SECONDS
    from srupp_asr.transcribe import transcribe

    model, utts = overfit_model_dir
    pieces, pauses, seconds = [], [], 0.0
    for wav_path, _ in itertools.cycle(utts):
        wav = load_audio(wav_path)
        pieces += [wav, np.zeros(int(0.8 * SAMPLE_RATE), dtype=np.float32)]
        seconds += len(wav) / SAMPLE_RATE
        pauses.append((seconds, seconds + 0.8))
        seconds += 0.8
        if seconds > 2.5 * ATTENTION_PIECE_SECONDS:
            break
    audio = np.concatenate(pieces)
    sf.write(tmp_path / "long.wav", audio, SAMPLE_RATE)
    updates = []
    monkeypatch.setattr(tqdm.tqdm, "update", lambda self, n=1: updates.append(n))
    (t,) = transcribe([tmp_path / "long.wav"], model, batch_size=2)
    assert t.decoding["mode"] == "joint"
    assert len(t.chunks) >= 3 and all(b - a <= ATTENTION_PIECE_SECONDS + 1e-6 for a, b in t.chunks)
    cuts = [b for (_, b), (a, _) in zip(t.chunks[:-1], t.chunks[1:], strict=True) if a == b]
    assert len(cuts) == len(t.chunks) - 1 and all(any(p < c < q for p, q in pauses) for c in cuts)
    assert len(updates) >= 2 and sum(updates) == pytest.approx(t.duration, abs=0.01)
    alone = []
    for i, (a, b) in enumerate(t.chunks):
        sf.write(tmp_path / f"piece{i}.wav", audio[round(a * SAMPLE_RATE) : round(b * SAMPLE_RATE)], SAMPLE_RATE)
        alone.append(tmp_path / f"piece{i}.wav")
    assert t.text == " ".join(p.text for p in transcribe(alone, model, batch_size=1) if p.text)
