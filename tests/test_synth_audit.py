"""Audit of the synthetic corpus builder: a negative seed, and a sentence pool of given texts left in the folder."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from srupp_asr.cli import main
from srupp_asr.synth import corpus
from srupp_asr.synth.corpus import build_corpus
from srupp_asr.synth.texts import filter_sentences

_ANIMALS = ("cat", "dog", "owl", "fox", "goat", "horse", "mouse", "duck")
_PLACES = ("by the river", "on the hill", "in the barn", "near the house", "under the tree")
# 40 sentences each; DEBIAN stands in for Debian's texts (collecting those takes 20 s).
GIVEN = [f"The old {animal} slept {place} all day." for animal in _ANIMALS for place in _PLACES]
DEBIAN = [f"A young {animal} ran {place} at night." for animal in _ANIMALS for place in _PLACES]
VOICES = ["espeak_en-us", "espeak_en-us_f4"]


def test_negative_seed_is_refused_in_one_line(tmp_path, capsys):
    # Was: --seed -1 reached numpy's default_rng([-1, 2]) and ended in a ValueError traceback ("expected
    # non-negative integer") after 20 s of collecting sentences; now a one-line error, exit status 2, no folder.
    out = tmp_path / "corpus"
    assert main(["synth-corpus", str(out), "--size", "tiny", "--seed", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "srupp-asr synth-corpus: error: --seed: must be 0 or more, got -1"
    ]
    assert not out.exists()


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_build_without_text_does_not_reuse_a_pool_of_given_sentences(tmp_path, monkeypatch):
    # Was: a build with --text saved its 40 given sentences as text/sentences.tsv; a rerun without --text took
    # that file for the cached Debian pool: corpus.json said "texts": "debian" with 40 sentences from source
    # "user", and every cut still read a given sentence. Now the rerun collects Debian's sentences again.
    debian = filter_sentences(("fortunes", t) for t in DEBIAN)
    monkeypatch.setattr(corpus, "collect_sentences", lambda report=None: list(debian))
    kwargs = {"size": "tiny", "seed": 0, "voices": VOICES, "max_utts": 1, "jobs": 1, "progress": False}
    build_corpus(tmp_path, texts=GIVEN, **kwargs)
    build_corpus(tmp_path, **kwargs)
    info = json.loads((tmp_path / "corpus.json").read_text())
    assert info["config"]["texts"] == "debian"
    assert info["text"]["sentences"] == 40
    sources = set()
    for split in ("train", "dev", "test_seen", "test_unseen"):
        with gzip.open(tmp_path / "manifests" / f"{split}_cuts.jsonl.gz", "rt") as f:
            sources |= {json.loads(line)["custom"]["source"] for line in f}
    assert sources == {"fortunes"}
    table = (tmp_path / "text" / "sentences.tsv").read_text().splitlines()
    assert table[1].startswith("fortunes-000001\tfortunes\t") and len(table) == 41
