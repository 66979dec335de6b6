"""Transcript normalisation."""

from __future__ import annotations

import pytest

from srupp_asr.text import normalize_text


def test_lowercases_and_turns_punctuation_into_spaces():
    assert normalize_text("Hello, World! It's well-known: 3.5%.") == "hello world it's well known 3 5"


def test_keeps_in_word_apostrophes_and_maps_typographic_ones():
    assert normalize_text("DON’T stop, rock'n'roll at o‘clock; don´t") == "don't stop rock'n'roll at o'clock don't"


def test_drops_leading_trailing_and_doubled_apostrophes():
    assert normalize_text("'Tis the students' books ''quoted''") == "tis the students books quoted"


def test_casefold_folds_sharp_s_and_final_sigma():
    assert normalize_text("STRASSE Straße") == "strasse strasse"
    assert normalize_text("ΣΊΣΥΦΟΣ σίσυφος") == "σίσυφοσ σίσυφοσ"


def test_nfkc_folds_fullwidth_forms_ligatures_and_superscripts():
    assert normalize_text("Ｆｕｌｌ ﬁne x² １２３") == "full fine x2 123"


def test_mandarin_characters_survive_and_cjk_punctuation_separates():
    assert normalize_text("你好，世界。今天　天气很好！") == "你好 世界 今天 天气很好"


def test_combining_marks_of_devanagari_and_decomposed_accents_survive():
    assert normalize_text("नमस्ते, दुनिया") == "नमस्ते दुनिया"
    assert normalize_text("Cafe\u0301") == "café"  # NFKC composes e + combining acute


def test_symbols_and_detached_diacritics_become_spaces():
    assert normalize_text("a ¨ b + c = d ♪ e") == "a b c d e"


def test_whitespace_collapses_and_blank_text_gives_empty():
    assert normalize_text("  one\t\ttwo\nthree  ") == "one two three"
    assert normalize_text(" \t\n… — ") == ""


@pytest.mark.parametrize(
    "text", ["Hello, World!", "DON’T 'stop'", "你好，世界。", "Straße ¨ x²", "नमस्ते", "a''b", "İstanbul"]
)
def test_normalisation_is_idempotent(text):
    once = normalize_text(text)
    assert normalize_text(once) == once
