"""The Brown Corpus as LM text (:mod:`srupp_asr.brown`, ``recipes/synth_en/local/lm_text.py --brown``): tagged lines
written out again, the sample files found, sentences sharing words with held-out transcripts told, the recipe's
train/dev split and its report. A real copy of the corpus (``local/fetch_brown.sh``) is read when present."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from srupp_asr.brown import GENRES, brown_sentences, contaminated, detokenize, sample_files, word_ngrams
from srupp_asr.errors import UserError
from srupp_asr.synth.texts import filter_sentences

ROOT = Path(__file__).resolve().parents[1]
# Where fetch_brown.sh puts the corpus by default (git-ignored data/); BROWN_DIR overrides.
REAL_COPY = Path(os.environ.get("BROWN_DIR", ROOT / "data" / "brown"))


def lm_text_script():
    spec = importlib.util.spec_from_file_location("lm_text", ROOT / "recipes" / "synth_en" / "local" / "lm_text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("tagged", "written"),
    [
        ("He/pps was/bedz well/rb rid/jj of/in her/ppo ./.", "He was well rid of her."),
        ("``/`` Only/rb a/at handful/nn ,/, ''/'' he/pps said/vbd ./.", '"Only a handful," he said.'),
        ("He/pps ran/vbd (/( fast/rb )/) ;/. didn't/dod* he/pps ?/.", "He ran (fast); didn't he?"),
        ("She/pps said/vbd ,/, ``/`` Go/vb !/. ''/''", 'She said, "Go!"'),
        ("The/at-tl Fulton/np-tl County/nn-tl", "The Fulton County"),  # title and headline tags
        ("1/2/cd inch/nn", "1/2 inch"),  # the tag is after the last slash
    ],
)
def test_tagged_lines_are_written_out_again(tagged: str, written: str) -> None:
    assert detokenize(tagged) == written


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """Three samples (two genres) in the tagged form, with the files that are not samples beside them."""
    (tmp_path / "ca01").write_text("\n\n\tThe/at jury/nn said/vbd ./.\n\tIt/pps rained/vbd ./.\n", encoding="latin-1")
    (tmp_path / "ca02").write_text("\tVoters/nns voted/vbd ./.\n", encoding="latin-1")
    (tmp_path / "cn01").write_text("\tDan/np Morgan/np told/vbd himself/ppl ./.\n", encoding="latin-1")
    (tmp_path / "CONTENTS").write_text("A. PRESS: REPORTAGE\n")
    (tmp_path / "README").write_text("BROWN CORPUS\n")
    (tmp_path / "cats.txt").write_text("ca01 news\n")
    return tmp_path


def test_the_samples_are_read_in_order_and_by_genre(corpus: Path) -> None:
    assert [p.name for p in sample_files(corpus)] == ["ca01", "ca02", "cn01"]
    assert list(brown_sentences(corpus)) == [
        ("ca01", "The jury said."),
        ("ca01", "It rained."),
        ("ca02", "Voters voted."),
        ("cn01", "Dan Morgan told himself."),
    ]
    assert [name for name, _ in brown_sentences(corpus, genres="n")] == ["cn01"]
    assert set(GENRES) == set("abcdefghjklmnpr")  # 15 genres, no i, o or q
    with pytest.raises(UserError, match=r"^Brown Corpus genres: no i, z "):
        list(brown_sentences(corpus, genres="niz"))


def test_a_folder_without_samples_is_one_line_naming_it(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "missing"):
        with pytest.raises(UserError, match=f"^{folder}: no Brown Corpus sample files"):
            sample_files(folder)


def test_sentences_sharing_a_run_of_words_with_held_out_text_are_told() -> None:
    held_out = ["Author of the danger trail, Philip Steels, etc.", "Not at all."]
    sentences = [
        "He read the author of the danger trail, Philip, twice.",  # six words in a row of the first
        "The danger trail was long.",  # three words only
        "She said not at all, and left.",  # the whole of a transcript shorter than six words
        "Nothing at all.",
    ]
    assert contaminated(sentences, held_out, n=6) == [True, False, True, False]
    assert word_ngrams("A b, C.", 2) == {("a", "b"), ("b", "c")}
    assert word_ngrams("Yes.", 3) == {("yes",)}


def test_the_recipe_splits_brown_into_train_and_dev_without_pool_or_held_out_sentences(tmp_path: Path) -> None:
    lines = {
        "ca01": "The/at jury/nn said/vbd it/pps had/hvd no/at evidence/nn at/in all/abn ./.",
        "ca02": "The/at city/nn voted/vbd for/in the/at new/jj plan/nn on/in Friday/nr ./.",
        "cn02": "He/pps met/vbd the/at author/nn of/in the/at danger/nn trail/nn ,/, Philip/np Steels/np ./.",
        "cp02": "She/pps looked/vbd at/in the/at old/jj house/nn for/in a/at while/nn ./.",
    }
    for name, line in lines.items():
        (tmp_path / name).write_text(f"\t{line}\n\tToo/rb short/jj ./.\n", encoding="latin-1")
    pool = filter_sentences([("fortunes", "The city voted for the new plan on Friday.")])
    held_out = ["Author of the danger trail, Philip Steels, etc."]
    train, dev, report = lm_text_script().brown_text(tmp_path, pool, held_out)
    assert dev == ["The jury said it had no evidence at all."]  # ca01: the first sample of its genre
    assert train == ["She looked at the old house for a while."]
    assert report == "8 Brown sentences: 1 in the pool, 4 too short, 1 sharing 6 words with --held-out"


@pytest.mark.skipif(not REAL_COPY.is_dir(), reason=f"no Brown Corpus at {REAL_COPY} (local/fetch_brown.sh)")
def test_the_real_corpus_has_its_500_samples_and_reads_as_prose() -> None:
    files = sample_files(REAL_COPY)
    assert len(files) == 500
    sentences = [text for _, text in brown_sentences(REAL_COPY)]
    assert len(sentences) > 50_000
    assert sentences[0].startswith("The Fulton County Grand Jury said Friday an investigation")
    assert not any("/" in s.split()[0] and s.split()[0].count("/") == 1 and s[0].islower() for s in sentences[:100])
