"""The word list of the search (srupp_asr.decoding.lexicon): its state machine against a string reference, the
searches choosing listed words (numpy and torch alike), reading the file, and the weight's way from the LM directory
to the options."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import srupp_asr.runtime.search as runtime
from srupp_asr.decoding import beam_search as torch_search
from srupp_asr.decoding import scorers as torch_scorers
from srupp_asr.decoding.lexicon import (
    DEAD,
    EMPTY,
    Lexicon,
    LexiconScorer,
    LexiconTable,
    WordList,
    lexicon_path,
    read_word_list,
)
from srupp_asr.decoding.options import DecodingOptions
from srupp_asr.errors import UserError
from srupp_asr.loading import choose_lm, fused_options
from srupp_asr.model_files import read_lexicon_weight
from srupp_asr.tokenizer import Tokenizer

from .test_runtime_search import NumpyBigram, TorchBigram

BUILTIN = Path(__file__).resolve().parent.parent / "srupp_asr" / "default_model"
# blank, unk, <sos/eos>, then pieces: word starts (the mark alone too) and continuations
PIECES = ["<blank>", "<unk>", "<sos/eos>", "\u2581c", "\u2581ca", "\u2581", "a", "t", "r", "s", "\u2581at", "x"]
WORDS = ["cat", "cats", "car", "at", "a"]
EOS = 2


def table(words=WORDS) -> LexiconTable:
    return LexiconTable(Lexicon(words), PIECES, [0, 1], EOS)


def reference_penalty(tokens: list[int], words=WORDS) -> int:
    """Words outside the list in the text the tokens spell (what the search is charged in all, at the end)."""
    text = "".join(PIECES[t] for t in tokens).replace("\u2581", " ")
    return sum(word not in words for word in text.split())


def run(t: LexiconTable, tokens: list[int]) -> tuple[float, list[int]]:
    """The penalties charged token by token (``tokens`` then the end), and the states passed through."""
    state, total, states = np.array([EMPTY], dtype=np.int32), 0.0, []
    for token in [*tokens, EOS]:
        total += float(t.penalties(state, np.array([[token]]))[0, 0])
        state = t.successors(state, np.array([token]))
        states.append(int(state[0]))
    return total, states


def step(t: LexiconTable, state: int, token: int) -> tuple[float, int]:
    """The penalty of ``token`` after ``state``, and the state after it."""
    s = np.array([state], dtype=np.int32)
    return float(t.penalties(s, np.array([[token]]))[0, 0]), int(t.successors(s, np.array([token]))[0])


def test_lexicon_prefixes_and_words() -> None:
    lexicon = Lexicon(["cat", "car", "at"])
    assert lexicon.prefixes(["", "ca", "cat", "cb", "cats", "z"]).tolist() == [True, True, True, False, False, False]
    assert "cat" in lexicon and "ca" not in lexicon and len(lexicon) == 3
    assert list(Lexicon(["b a\u00a0c\u3000d\x1ce\t\r\n", "", "a"])) == ["a", "b", "c", "d", "e"]  # any white space


def test_lexicon_answers_as_a_sorted_list_of_str_would_long_and_non_ascii_words_too() -> None:
    """Random words of 1-40 letters (some past SHORT_BYTES, some with letters of two or three UTF-8 bytes), asked
    about every beginning and word of theirs and random strings: the answers of a plain sorted list."""
    from srupp_asr.decoding.lexicon import SHORT_BYTES

    rng = np.random.default_rng(2)
    letters = ["a", "b", "c", "z", "\u00e9", "\u0142", "\u20ac"]
    words = ["".join(rng.choice(letters, size=int(rng.integers(1, 41)))) for _ in range(400)]
    words += ["ab\0c", "x" * SHORT_BYTES, "x" * (SHORT_BYTES + 1), "y" * (SHORT_BYTES + 5)]
    lexicon = Lexicon(words)
    listed = sorted({w for w in words if "\0" not in w})
    assert list(lexicon) == listed and len(lexicon) == len(listed)
    assert any(len(w.encode()) > SHORT_BYTES for w in listed) and any(len(w.encode()) <= SHORT_BYTES for w in listed)
    queries = [w[:i] for w in words[:100] for i in range(len(w) + 2)]
    queries += ["".join(rng.choice(letters, size=int(rng.integers(0, 30)))) for _ in range(300)]
    queries += ["x" * SHORT_BYTES, "x" * (SHORT_BYTES + 1), "y" * (SHORT_BYTES + 2), "ab", "ab\0"]
    assert lexicon.prefixes(queries).tolist() == [any(w.startswith(q) for w in listed) for q in queries]
    assert [q in lexicon for q in queries] == [q in listed for q in queries]
    assert Lexicon(["y" * 30]).prefixes(["", "y", "z"]).tolist() == [True, True, False]  # only long words


def test_each_word_outside_the_list_is_charged_once_whatever_its_pieces() -> None:
    t = table()
    rng = np.random.default_rng(0)
    for _ in range(400):
        tokens = rng.integers(3, len(PIECES), size=int(rng.integers(0, 8))).tolist()
        total, _ = run(t, tokens)
        assert total == reference_penalty(tokens), [PIECES[i] for i in tokens]


def test_one_table_serves_threads_at_once() -> None:
    """transcribe decodes two batches at once with one LM, so one table: four threads filling and reading it at
    once get the charges one thread would."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(1)
    letters = list("atrsx")
    words = sorted({"".join(rng.choice(letters, size=int(rng.integers(1, 7)))) for _ in range(3000)})
    t = table(words)
    sequences = [rng.integers(3, len(PIECES), size=int(rng.integers(1, 12))).tolist() for _ in range(600)]

    def charged(tokens: list[int]) -> float:
        state, total = np.array([EMPTY], dtype=np.int32), 0.0
        for token in [*tokens, EOS]:
            total += float(t.penalties(state, np.array([[token]]))[0, 0])
            state = t.successors(state, np.array([token]))
        return total

    with ThreadPoolExecutor(4) as pool:
        totals = list(pool.map(charged, sequences))
    assert totals == [reference_penalty(tokens, words) for tokens in sequences]


def test_the_charge_falls_where_the_word_leaves_the_list() -> None:
    t = table()
    c, a, x, s, t_, space = (PIECES.index(p) for p in ("\u2581c", "a", "x", "s", "t", "\u2581"))
    assert step(t, EMPTY, c)[0] == 0
    c_state = step(t, EMPTY, c)[1]
    assert step(t, c_state, x) == (1.0, DEAD)  # "cx" begins no word: charged here
    assert step(t, c_state, EOS)[0] == 1  # "c" is only the beginning of words: charged where it ends
    assert step(t, c_state, 1)[0] == 1  # unk spells no word
    ca = step(t, EMPTY, PIECES.index("\u2581ca"))[1]
    assert step(t, c_state, a)[1] == ca  # one state per beginning, however it was spelt
    cat = step(t, ca, t_)[1]
    assert step(t, cat, s)[0] == 0 and step(t, cat, EOS)[0] == 0 and step(t, cat, space)[0] == 0
    assert step(t, DEAD, x) == (0.0, DEAD) and step(t, DEAD, EOS)[0] == 0  # charged once, when it left the list
    assert step(t, EMPTY, a)[0] == 0  # "a" after nothing begins a word
    assert t.filled < t.states  # rows only for the states scored


def test_a_word_list_starts_a_fresh_table_past_its_bound(monkeypatch) -> None:
    from srupp_asr.decoding import lexicon

    words = WordList(Lexicon(WORDS), PIECES, [0, 1], EOS)
    first = words.table()
    assert words.table() is first
    run(first, [PIECES.index("\u2581ca"), PIECES.index("t")])
    monkeypatch.setattr(lexicon, "MAX_TABLE_STATES", first.states - 1)
    fresh = words.table()
    assert fresh is not first and fresh.states == table().states < first.states  # new: its word starts' states only
    assert run(first, [3, 6, 7])[0] == 0  # the old one still works


def test_the_search_spells_listed_words_when_the_lexicon_weighs() -> None:
    """A bigram that prefers "cx" to "cat" (both end equally well): the lexicon turns the choice, in both searches,
    with the same scores."""
    V = len(PIECES)
    bigram = np.full((V, V), -9.0, dtype=np.float32)
    c, a, t_, x = PIECES.index("\u2581c"), PIECES.index("a"), PIECES.index("t"), PIECES.index("x")
    bigram[EOS, c] = -0.1
    bigram[c, x], bigram[c, a] = -0.5, -1.0
    bigram[a, t_] = -0.1
    bigram[x, EOS] = bigram[t_, EOS] = -0.1
    for weight, expected in ((0.0, [c, x]), (1.0, [c, a, t_])):
        tab = table()
        ported = [(NumpyBigram(bigram), 1.0), (LexiconScorer(tab), weight)]
        reference = [(TorchBigram(bigram), 1.0), (torch_scorers.WordListScorer(tab), weight)]
        got = runtime.beam_search(ported, 1, np.array([6]), V, beam=3, nbest=2)
        want = torch_search.beam_search(reference, 1, torch.tensor([6]), V, beam=3, nbest=2)
        assert got[0][0][0] == expected
        assert [y for y, _ in got[0]] == [y for y, _ in want[0]]
        assert [s for _, s in got[0]] == pytest.approx([s for _, s in want[0]], abs=1e-5)


def test_word_lists_are_read_plain_or_compressed_and_bad_ones_named(tmp_path: Path) -> None:
    plain = tmp_path / "words.txt"
    plain.write_text("\ufeffCat\n\ncar\r\nat\ncar\n")
    assert list(Lexicon.read(plain)) == ["at", "car", "cat"]
    packed = tmp_path / "words.txt.gz"
    packed.write_bytes(gzip.compress(b"cat\ncar\n"))
    assert list(Lexicon.read(packed)) == ["car", "cat"]
    bad = {
        "latin1.txt": (b"cat\ncaf\xe9\n", "latin1.txt:2: word list is not UTF-8"),
        "empty.txt": (b"\n\n", "the word list is empty"),
        "broken.txt.gz": (b"not gzip at all", "not gzip data"),
        "bomb.txt.gz": (gzip.compress(b"a\n" * (40 * 2**20)), "more than 64 MiB of text"),
    }
    for name, (data, message) in bad.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UserError, match=message) as err:
            Lexicon.read(tmp_path / name)
        assert name in str(err.value)
    with pytest.raises(UserError, match="is a directory"):
        Lexicon.read(tmp_path)
    os.mkfifo(tmp_path / "pipe.txt")  # no writer: a reader that opened it would wait for ever
    with pytest.raises(UserError, match=r"pipe\.txt: .*not a regular file \(a pipe"):
        Lexicon.read(tmp_path / "pipe.txt")


@pytest.fixture()
def lm_with_words(tmp_path: Path) -> Path:
    """A copy of the built-in model's LM that carries a word list (and records no weight for it)."""
    lm = tmp_path / "lm"
    shutil.copytree(BUILTIN / "lm", lm)
    for name in ("words.txt", "words.txt.gz"):
        (lm / name).unlink(missing_ok=True)
    (lm / "words.txt").write_text("the\ncat\nsat\n")
    config = (lm / "config.yaml").read_text()
    kept = (x for x in config.splitlines() if not x.startswith(("lexicon_weight", "length_penalty")))
    (lm / "config.yaml").write_text("\n".join(kept))
    return lm


def test_an_lm_directory_brings_its_word_list_and_weight(lm_with_words: Path, tmp_path: Path) -> None:
    tokenizer = Tokenizer(BUILTIN / "tokenizer.model")
    assert lexicon_path(lm_with_words) == lm_with_words / "words.txt"
    assert list(read_word_list(lm_with_words, tokenizer).table().lexicon) == ["cat", "sat", "the"]
    assert (
        read_lexicon_weight(lm_with_words) is None and choose_lm(BUILTIN, "joint", lm_with_words).lexicon_weight == 10.0
    )
    choice = choose_lm(BUILTIN, "joint", lm_with_words)
    assert fused_options(DecodingOptions("joint"), choice).lexicon_weight == 10.0
    assert fused_options(DecodingOptions("joint", lexicon_weight=2.5), choice).word_penalty == 2.5
    assert fused_options(DecodingOptions("joint", lexicon_weight=0.0), choice).word_penalty == 0.0
    (lm_with_words / "config.yaml").write_text((lm_with_words / "config.yaml").read_text() + "\nlexicon_weight: 3\n")
    assert fused_options(DecodingOptions("joint"), choose_lm(BUILTIN, "joint", lm_with_words)).lexicon_weight == 3.0
    (lm_with_words / "config.yaml").write_text((lm_with_words / "config.yaml").read_text() + "lexicon_weight: -1\n")
    with pytest.raises(UserError, match=r"config\.yaml: lexicon_weight must be a number"):
        choose_lm(BUILTIN, "joint", lm_with_words)
    plain = tmp_path / "plain_lm"
    shutil.copytree(lm_with_words, plain)
    (plain / "words.txt").unlink()
    with pytest.raises(UserError, match=r"--lexicon-weight needs an LM with a word list .*plain_lm has no word list"):
        fused_options(DecodingOptions("joint", lexicon_weight=5.0), choose_lm(BUILTIN, "joint", plain))
    with pytest.raises(UserError, match="no LM is fused"):
        fused_options(DecodingOptions("joint", lexicon_weight=5.0), choose_lm(BUILTIN, "joint", no_lm=True))
    with pytest.raises(ValueError, match="lexicon_weight must be a number"):
        DecodingOptions("joint", lexicon_weight=float("nan"))
    assert DecodingOptions("joint", lexicon_weight=4.0).word_penalty == 0.0  # no LM fused: no word list


def test_the_length_penalty_recorded_with_the_lm_applies_unless_one_is_asked_for(lm_with_words: Path) -> None:
    config = lm_with_words / "config.yaml"
    assert fused_options(DecodingOptions("joint"), choose_lm(BUILTIN, "joint", lm_with_words)).length_penalty == 0.0
    config.write_text(config.read_text() + "\nlength_penalty: 1.5\n")
    choice = choose_lm(BUILTIN, "joint", lm_with_words)
    assert fused_options(DecodingOptions("joint"), choice).token_bonus == 1.5
    assert fused_options(DecodingOptions("joint", length_penalty=0.0), choice).token_bonus == 0.0
    assert fused_options(DecodingOptions("joint", length_penalty=-2.0), choice).token_bonus == -2.0
    assert fused_options(DecodingOptions("joint"), choose_lm(BUILTIN, "joint", no_lm=True)).token_bonus == 0.0
    assert DecodingOptions("joint").token_bonus == 0.0  # decode() without transcribe's choice: none
    config.write_text(config.read_text().replace("length_penalty: 1.5", "length_penalty: .inf"))
    with pytest.raises(UserError, match=r"config\.yaml: length_penalty must be a number in \[-1000, 1000\]"):
        choose_lm(BUILTIN, "joint", lm_with_words)


def test_average_carries_the_word_list_into_the_model_directory(lm_with_words: Path, tmp_path: Path) -> None:
    from srupp_asr.average import lm_writer

    config = lm_with_words / "config.yaml"
    config.write_text(config.read_text() + "\nlength_penalty: 1.5\n")
    out = lm_writer(lm_with_words, BUILTIN / "tokenizer.model", 0.4, torch.float16)(tmp_path / "shipped")
    assert (out / "words.txt").read_text() == "the\ncat\nsat\n"
    assert read_lexicon_weight(out) == 10.0 and "lexicon_weight: 10.0" in (out / "config.yaml").read_text()
    assert "length_penalty: 1.5" in (out / "config.yaml").read_text()


def test_transcribe_uses_the_built_in_word_list_and_says_so(synthesize_speech, capsys) -> None:
    """The built-in model's LM carries its word list and its length bonus: the closing line and the JSON say so;
    --lexicon-weight 0 and --length-penalty 0 turn them off, and asking for a word list with --no-lm is one line,
    exit 2."""
    import json

    from srupp_asr.cli import main

    wav = str(synthesize_speech("the boy was specially maltreated", "maltreated.wav"))
    base = ["transcribe", wav, "--device", "cpu"]
    assert main(base) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(
        "its word list at 10 (--lexicon-weight 0: without); length bonus 1 a token (--length-penalty 0: without)"
    ), last
    assert main([*base, "--lexicon-weight", "0", "--length-penalty", "0"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "word list" not in last and "bonus" not in last and "language model" in last
    assert main([*base, "--no-lm"]) == 0
    assert "bonus" not in capsys.readouterr().err.strip().splitlines()[-1]  # the bonus is the LM's: none without it
    assert main([*base, "--no-lm", "--lexicon-weight", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--lexicon-weight needs an LM with a word list (words.txt): no LM is fused")
    out = Path(wav).parent / "json_out"
    assert main([*base, "--output_format", "json", "--output_dir", str(out), "-q"]) == 0
    decoding = json.loads((out / "maltreated.json").read_text())["decoding"]
    assert (decoding["lexicon_weight"], decoding["beam"], decoding["lm_weight"]) == (10.0, 10, 0.4)
    assert decoding["length_penalty"] == 1.0


def test_the_api_takes_the_word_list_weight_as_a_keyword(synthesize_speech) -> None:
    import srupp_asr

    wav = str(synthesize_speech("call me that again he murmured", "murmured.wav"))
    model = srupp_asr.load_model(None, device="cpu")
    assert model.transcribe(wav).decoding["lexicon_weight"] == 10.0
    assert model.transcribe(wav, lexicon_weight=0).decoding["lexicon_weight"] == 0.0
    assert model.transcribe(wav, lexicon_weight=2.5, beam=4).decoding["lexicon_weight"] == 2.5
    with pytest.raises(UserError, match="lexicon_weight must be a number in"):
        model.transcribe(wav, lexicon_weight=-1)


def test_word_list_py_normalises_and_keeps_what_the_tokenizer_spells(tmp_path: Path) -> None:
    import importlib.util

    script = BUILTIN.parent.parent / "recipes" / "synth_en" / "local" / "word_list.py"
    spec = importlib.util.spec_from_file_location("word_list", script)
    word_list = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(word_list)
    (tmp_path / "list").write_text("Cat\ndon't\nNew York\n3rd\ncafé\nO'Brien's\ncat\n")
    (tmp_path / "text").write_text("Whittemore smiled, twice.\n")
    out = tmp_path / "words.txt.gz"
    assert word_list.main([str(out), str(tmp_path / "list"), "--text", str(tmp_path / "text")]) == 0
    words = gzip.decompress(out.read_bytes()).decode().split("\n")
    # two words on a line and digits are no word of the list; "é" is no letter of the built-in tokenizer's
    assert words == ["cat", "don't", "o'brien's", "smiled", "twice", "whittemore", ""]
    assert list(Lexicon.read(out)) == words[:-1]
    assert word_list.main([str(out), str(tmp_path / "missing")]) == 2
