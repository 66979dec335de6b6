"""The counts of ``srupp-asr score`` equal those of NIST sclite (Debian's ``sctk``) on the same files.

A seeded corpus of references and hypotheses (random word edits, unicode words in several scripts, empty
hypotheses, empty references, references without a hypothesis, long utterances, tiny vocabularies that make
many equal-cost alignments) is scored with ``srupp-asr score``; sclite then scores the ``ref.trn`` / ``hyp.trn``
files that the report wrote, by words and by characters (``-c``), and every total is compared: per utterance,
per speaker and overall.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from srupp_asr.cli import main
from srupp_asr.scoring.align import Counts
from srupp_asr.scoring.analysis import ScoreResult
from srupp_asr.scoring.score import score

WORDS = ["the", "a", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "don't", "o'clock", "seven"]
UNICODE = ["naïve", "café", "straße", "你好", "世界", "日本語", "мир", "привет", "नमस्ते", "हिन्दी", "ﬁne", "Ελλάδα"]
SPEAKERS = [f"spk{i}" for i in range(8)]


def _sclite() -> list[str] | None:
    if path := shutil.which("sclite"):
        return [path]
    if Path("/usr/lib/sctk/bin/sclite").is_file():  # Debian keeps it off PATH, behind the `sctk` wrapper
        return ["/usr/lib/sctk/bin/sclite"]
    return None


SCLITE = _sclite()
pytestmark = pytest.mark.skipif(SCLITE is None, reason="sclite is not installed (apt-get install sctk)")


def _edit(rng: random.Random, words: list[str], vocab: list[str], rate: float) -> list[str]:
    out = []
    for w in words:
        r = rng.random()
        if r < rate:
            continue  # deletion
        out.append(rng.choice(vocab) if r < 2 * rate else w)  # substitution
        if rng.random() < rate:
            out.append(rng.choice(vocab))  # insertion
    return out


def make_corpus(rng: random.Random) -> tuple[list[str], list[str]]:
    """Kaldi ``text`` lines of references and hypotheses, covering the cases sclite must agree on."""
    vocab = WORDS + UNICODE
    refs, hyps = [], []

    def add(ref: list[str], hyp: list[str] | None) -> None:
        utt_id = f"{SPEAKERS[len(refs) % len(SPEAKERS)]}-utt{len(refs):04d}"
        refs.append(f"{utt_id} {' '.join(ref)}".rstrip())
        if hyp is not None:
            hyps.append(f"{utt_id} {' '.join(hyp)}".rstrip())

    for _ in range(160):  # ordinary utterances with word errors
        ref = [rng.choice(vocab) for _ in range(rng.randint(1, 25))]
        add(ref, _edit(rng, ref, vocab, rng.choice([0.0, 0.05, 0.15, 0.3])))
    for _ in range(80):  # tiny vocabularies: many alignments of equal cost, decided by tie-breaking
        small = rng.sample(vocab, 3)
        add(
            [rng.choice(small) for _ in range(rng.randint(1, 12))],
            [rng.choice(small) for _ in range(rng.randint(0, 12))],
        )
    for _ in range(40):  # three substitutions cost as much as 2 deletions + 1 match + 2 insertions: a pure tie
        p, q, r, t, m = rng.sample(vocab, 5)
        left, right = [rng.choice(vocab) for _ in range(rng.randint(0, 4))], [rng.choice(vocab) for _ in range(3)]
        ref, hyp = ([p, q, m], [m, r, t]) if rng.random() < 0.5 else ([m, p, q], [r, t, m])
        add(left + ref + right, left + hyp + right)
    for _ in range(6):
        add([rng.choice(vocab) for _ in range(rng.randint(1, 10))], [])  # empty hypothesis
        add([], [rng.choice(vocab) for _ in range(rng.randint(1, 4))])  # empty reference
    add([], [])
    for _ in range(3):
        add([rng.choice(vocab) for _ in range(rng.randint(2, 8))], None)  # no hypothesis at all
    for _ in range(2):  # long utterances
        ref = [rng.choice(vocab) for _ in range(400)]
        add(ref, _edit(rng, ref, vocab, 0.1))
    hyps.append("stray-utt9999 ignored words")  # a hypothesis without reference
    rng.shuffle(hyps)
    return refs, hyps


_ROW = re.compile(r"^\s*\|\s*(\S+)\s*\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|")
_SCORES = re.compile(r"^id: \((\S+)\)\n(?:.*\n)*?Scores: \(#C #S #D #I\) (\d+) (\d+) (\d+) (\d+)", re.MULTILINE)


def run_sclite(out_dir: Path, chars: bool) -> tuple[dict[str, Counts], dict[str, tuple[int, ...]]]:
    """sclite's raw-count summary per speaker (+ ``Sum``) and its (C, S, D, I) per utterance."""
    cmd = [*SCLITE, "-r", "ref.trn", "trn", "-h", "hyp.trn", "trn", "-i", "rm", "-e", "utf-8", "-s"]
    cmd += ["-c"] if chars else []
    out = subprocess.run([*cmd, "-o", "rsum", "pralign", "stdout"], cwd=out_dir, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    text = out.stdout.decode("utf-8")
    speakers = {}
    for m in map(_ROW.match, text.splitlines()):
        if m:
            name, snt, tokens, cor, sub, dele, ins, err, serr = m.groups()
            counts = Counts(int(snt), int(serr), int(tokens), int(cor), int(sub), int(dele), int(ins))
            assert counts.errors == int(err)
            speakers[name] = counts
    utterances = {m.group(1): tuple(map(int, m.groups()[1:])) for m in _SCORES.finditer(text)}
    return speakers, utterances


def check_against_sclite(result: ScoreResult, out_dir: Path, level: str) -> None:
    speakers, utterances = run_sclite(out_dir, chars=level == "CER")
    assert speakers.pop("Sum") == result.total(level)
    assert speakers == result.by_speaker(level)
    ours = {}
    for u, c in zip(result.utterances, result.counts(level), strict=True):
        trn_id = u.utt_id if u.utt_id.startswith(f"{u.speaker}-") else f"{u.speaker}-{u.utt_id}"
        ours[trn_id] = (c.correct, c.substitutions, c.deletions, c.insertions)
    assert utterances == ours


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[ScoreResult, Path]:
    folder = tmp_path_factory.mktemp("sclite")
    refs, hyps = make_corpus(random.Random(20261122))
    (folder / "ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (folder / "hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    utt2spk = "".join(f"{line.split()[0]} {line.split('-')[0]}\n" for line in refs)
    (folder / "utt2spk").write_text(utt2spk, encoding="utf-8")
    files = {"ref": folder / "ref", "hyp": folder / "hyp", "utt2spk": folder / "utt2spk"}
    out = folder / "report"
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in files.items()]
    assert main(["score", *argv, "--out-dir", str(out)]) == 0
    return score(**files), out


def test_word_counts_equal_sclite_per_utterance_speaker_and_total(scored):
    result, out = scored
    assert result.missing and result.extra == ["stray-utt9999"]
    assert any(not u.ref for u in result.utterances) and any(not u.hyp for u in result.utterances)
    check_against_sclite(result, out, "WER")


def test_character_counts_equal_sclite_c(scored):
    result, out = scored
    check_against_sclite(result, out, "CER")


def _totals_preferring(ref: tuple[str, ...], hyp: tuple[str, ...], order: str) -> tuple[int, Counts]:
    """Minimal sclite cost and the totals of one optimal alignment, ties broken in ``order`` (e.g. "IDS")."""
    step = {"S": (1, 1), "D": (1, 0), "I": (0, 1)}
    best: dict[tuple[int, int], tuple[int, str]] = {(0, 0): (0, "")}
    for a in range(len(ref) + 1):
        for b in range(len(hyp) + 1):
            options = []
            for op in order:
                da, db = step[op]
                if (a - da, b - db) in best and a >= da and b >= db:
                    cost, ops = best[(a - da, b - db)]
                    same = op == "S" and ref[a - 1] == hyp[b - 1]
                    add = {"S": 0 if same else 4, "D": 3, "I": 3}[op]
                    options.append((cost + add, ops + ("C" if same else op)))
            if options:
                best[(a, b)] = min(options, key=lambda o: o[0])  # first of the cheapest: the preferred op
    cost, ops = best[(len(ref), len(hyp))]
    return cost, Counts(1, 0, len(ref), ops.count("C"), ops.count("S"), ops.count("D"), ops.count("I"))


def test_the_corpus_tells_tie_breaking_rules_apart(scored):
    # Scoring equal-cost alignments with another tie-break (insertions, then deletions, then the diagonal)
    # gives other totals on some utterances of this corpus, so agreeing with sclite above is not luck.
    result, _ = scored
    differ = 0
    for u in result.utterances:
        if len(u.words.ref) * len(u.words.hyp) > 400:
            continue  # the quadratic Python check stays fast
        cost, other = _totals_preferring(u.words.ref, u.words.hyp, "IDS")
        ours = u.words.counts
        assert cost == 4 * ours.substitutions + 3 * (ours.deletions + ours.insertions)  # both optimal
        differ += (other.substitutions, other.deletions) != (ours.substitutions, ours.deletions)
    assert differ >= 20


def test_long_utterances_within_the_bounds_equal_sclite(tmp_path):
    """The bounds (a line's characters, a pair's cells) leave long utterances to the same alignment: a 4,000-word
    talk-length line and a 2,000-word one equal sclite's counts, by words and by characters."""
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(300)]
    refs, hyps = [], []
    for i, length in enumerate((4000, 2000, 5)):
        words = [rng.choice(vocab) for _ in range(length)]
        refs.append(f"spk{i % 2}-u{i} " + " ".join(words))
        hyps.append(f"spk{i % 2}-u{i} " + " ".join(_edit(rng, words, vocab, 0.2)))
    (tmp_path / "ref").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tmp_path / "hyp").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "utt2spk").write_text("".join(f"{line.split()[0]} {line.split('-')[0]}\n" for line in refs))
    files = {"ref": tmp_path / "ref", "hyp": tmp_path / "hyp", "utt2spk": tmp_path / "utt2spk"}
    out = tmp_path / "report"
    assert main(["score", *[f"--{k}={v}" for k, v in files.items()], "--out-dir", str(out)]) == 0
    result = score(**files)
    check_against_sclite(result, out, "WER")
    check_against_sclite(result, out, "CER")
