"""The sentencepiece tokenizer wrapper: id conventions, round trips, determinism, the CLI."""

from __future__ import annotations

import argparse
import io
import pickle

import pytest
import sentencepiece as spm
from lhotse import CutSet, MonoCut, SupervisionSegment

from srupp_asr import tokenizer as tokenizer_module
from srupp_asr.errors import UserError
from srupp_asr.text import normalize_text
from srupp_asr.tokenizer import Tokenizer

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Don't stop me now, I'm having such a good time!",
    "She sells sea shells by the sea shore.",
    "How much wood would a woodchuck chuck?",
    "Peter Piper picked a peck of pickled peppers.",
    "A journey of a thousand miles begins with a single step.",
] * 20
MANDARIN = ["今天天气很好。", "我们去学校吧！", "你好，世界", "他在图书馆看书", "明天见"] * 10


@pytest.fixture(scope="module")
def unigram(tmp_path_factory) -> Tokenizer:
    return Tokenizer.train(ENGLISH, tmp_path_factory.mktemp("tok") / "tokenizer.model", vocab_size=60)


def test_special_ids_are_blank_unk_sos_eos(unigram):
    assert (unigram.blank_id, unigram.unk_id, unigram.sos_eos_id) == (0, 1, 2)
    assert [unigram.id_to_piece(i) for i in range(3)] == ["<blank>", "<unk>", "<sos/eos>"]
    assert unigram.vocab_size == len(unigram) == 60


def test_round_trip_gives_back_the_normalised_text(unigram):
    for text in ["The quick brown fox!", "Don't stop, Peter.", "WOOD would  a sea-shell"]:
        assert unigram.decode(unigram.encode(text)) == normalize_text(text)


def test_encode_never_emits_blank_or_sos_eos(unigram):
    ids = unigram.encode("<sos/eos> <blank> zebra 你 the")
    assert ids and 0 not in ids and 2 not in ids
    assert unigram.unk_id in ids  # 你 was never seen


def test_decode_drops_blank_sos_eos_and_padding(unigram):
    ids = unigram.encode("peck of peppers")
    noisy = [2, 0, *ids[:2], 0, 0, *ids[2:], 2, -1, -1]
    assert unigram.decode(noisy) == "peck of peppers"


def test_training_is_deterministic_and_leaves_no_temporary_files(tmp_path):
    first = Tokenizer.train(ENGLISH, tmp_path / "a" / "tokenizer.model", vocab_size=50, model_type="bpe")
    second = Tokenizer.train(ENGLISH, tmp_path / "b" / "tokenizer.model", vocab_size=50, model_type="bpe")
    assert first.path.read_bytes() == second.path.read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["tokenizer.model"]


def test_char_model_on_mandarin_uses_the_character_inventory(tmp_path):
    tok = Tokenizer.train(MANDARIN, tmp_path / "zh.model", vocab_size=5000, model_type="char")
    chars = set("".join(normalize_text(t).replace(" ", "") for t in MANDARIN))
    assert tok.vocab_size == 3 + 1 + len(chars)  # specials, the word-start piece, one per character
    text = "你好，今天我们去图书馆"
    ids = tok.encode(text)
    assert [tok.id_to_piece(i) for i in ids[1:3]] == ["你", "好"]
    assert tok.decode(ids) == "你好 今天我们去图书馆"


def test_tokenizer_survives_pickling_for_dataloader_workers(unigram):
    copy = pickle.loads(pickle.dumps(unigram))
    assert copy.encode("the lazy dog") == unigram.encode("the lazy dog")
    assert copy.vocab_size == unigram.vocab_size


def test_vocab_too_large_for_unigram_is_a_user_error_naming_the_limit(tmp_path):
    with pytest.raises(UserError, match=r"vocabulary size 5000 is too large .* use <= \d+"):
        Tokenizer.train(ENGLISH, tmp_path / "t.model", vocab_size=5000)
    assert not (tmp_path / "t.model").exists()


def test_empty_training_text_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no training text"):
        Tokenizer.train(["...", "  ", "!?"], tmp_path / "t.model", vocab_size=50)


def test_loading_a_missing_or_foreign_model_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"missing\.model: tokenizer model not found"):
        Tokenizer(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(UserError, match=r"junk\.model: not a sentencepiece model"):
        Tokenizer.load(tmp_path / "junk.model")
    plain = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(ENGLISH), model_writer=plain, vocab_size=60, minloglevel=2)
    (tmp_path / "plain.model").write_bytes(plain.getvalue())
    with pytest.raises(UserError, match=r"plain\.model: id 0 is '<unk>', expected '<blank>'"):
        Tokenizer(tmp_path / "plain.model")


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    tokenizer_module.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_trains_on_cut_manifests_and_text_files(tmp_path, capsys):
    cuts = CutSet.from_cuts(
        MonoCut(
            id=f"c{i}",
            start=0,
            duration=1,
            channel=0,
            supervisions=[SupervisionSegment(id=f"c{i}", recording_id="r", start=0, duration=1, text=t)],
        )
        for i, t in enumerate(MANDARIN[:5])
    )
    cuts.to_file(tmp_path / "train.jsonl.gz")
    (tmp_path / "extra.txt").write_text("天空很蓝\n\n", encoding="utf-8")
    out = tmp_path / "lang" / "tokenizer.model"
    argv = ["tokenizer", "--cuts", str(tmp_path / "train.jsonl.gz"), "--text", str(tmp_path / "extra.txt")]
    assert _run([*argv, "--out", str(out), "--vocab-size", "500", "--model-type", "char"]) == 0
    tok = Tokenizer(out)
    assert tok.unk_id not in tok.encode("天空 今天很好")  # characters from both sources are in the vocabulary
    assert f"wrote {out} (char, {tok.vocab_size} pieces)" in capsys.readouterr().out


def test_cli_names_a_missing_text_file(tmp_path):
    with pytest.raises(UserError, match=r"nope\.txt: cannot read text file"):
        _run(["tokenizer", "--text", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "t.model")])
