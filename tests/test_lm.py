"""The SRU++ language model: step-by-step scoring equals the whole-sentence forward, LM directories round-trip (from
shards too) and refuse what is not theirs (a pickle, bad settings), and shallow fusion adds ``lm_weight * log P_lm``
in every beam mode: its scores are the LM's whole-sentence log-probabilities, ``<sos/eos>`` included, batched or not.
Training the LM (``train-lm``) is tests/test_lm_train.py."""

from __future__ import annotations

import math
import os
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from srupp_asr.cli import main
from srupp_asr.decoding import DecodingOptions, decode_encoded
from srupp_asr.decoding.beam_search import beam_search
from srupp_asr.decoding.rescoring import attention_scores
from srupp_asr.decoding.scorers import CTCPrefixScorer, LMScorer
from srupp_asr.errors import UserError
from srupp_asr.lm import SOS_EOS_ID, SRUppLM, load_lm, save_lm
from srupp_asr.model import ASRModel
from srupp_asr.model_dir import write_model_dir
from srupp_asr.tokenizer import Tokenizer
from tests.helpers import evil_pickle

SENTENCES = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog",
    "the mat is on the log",
    "a dog sat on a cat",
] * 8


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    """A character tokenizer of :data:`SENTENCES`."""
    return Tokenizer.train(SENTENCES, tmp_path_factory.mktemp("lm_tok") / "tokenizer.model", 40, "char")


def tiny_lm(vocab: int, attn_every: int = 1, seed: int = 0) -> SRUppLM:
    torch.manual_seed(seed)
    lm = SRUppLM(vocab, d_model=32, num_layers=3, attn_dim=16, num_heads=2, attn_every=attn_every, dropout=0.0)
    for layer in lm.body.layers:  # attention on (alpha starts at 0), so the key/value caches are exercised
        if layer.attention:
            torch.nn.init.constant_(layer.alpha, 0.7)
    return lm.eval()


@pytest.mark.parametrize("attn_every", [1, 2, 0])
def test_step_by_step_log_probs_equal_the_whole_sentence_forward(attn_every: int) -> None:
    lm = tiny_lm(30, attn_every)
    sentences = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [], [3, 3, 3]]
    inputs, targets, lengths = lm.batch(sentences)
    with torch.no_grad():
        whole = lm(inputs, lengths).log_softmax(-1)
        states = None
        steps = []
        for t in range(inputs.shape[1]):
            log_probs, states = lm.step(inputs[:, t], states)
            steps.append(log_probs)
        stepped = torch.stack(steps, 1)
        for b, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(stepped[b, :n], whole[b, :n], atol=1e-5, rtol=1e-5)
        # sentence_nll: -(sum of the step log-probs of each target, <sos/eos> at the end included)
        expected = [-sum(float(stepped[b, t, targets[b, t]]) for t in range(n)) for b, n in enumerate(lengths.tolist())]
        torch.testing.assert_close(lm.sentence_nll(sentences), torch.tensor(expected), atol=1e-4, rtol=1e-5)


def test_lm_directory_round_trip_and_refusals(tokenizer: Tokenizer, tmp_path: Path) -> None:
    lm = tiny_lm(tokenizer.vocab_size)
    out = save_lm(lm, tokenizer.path, tmp_path / "lm")
    loaded, tok = load_lm(out)
    assert tok.vocab_size == tokenizer.vocab_size
    ys = [tokenizer.encode("the cat"), tokenizer.encode("a dog sat")]
    with torch.no_grad():
        torch.testing.assert_close(loaded.sentence_nll(ys), lm.sentence_nll(ys))
    with pytest.raises(UserError, match="LM directory not found"):
        load_lm(tmp_path / "missing")
    asr_like = tmp_path / "asr"
    asr_like.mkdir()
    (asr_like / "config.yaml").write_text("format_version: 1\nmodel: {vocab_size: 40}\n")
    with pytest.raises(UserError, match="an ASR model, not an LM"):
        load_lm(asr_like)
    (out / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(UserError, match=r"model\.safetensors: not a readable safetensors file"):
        load_lm(out)
    other = Tokenizer.train(["xyz qrs " * 3] * 5, tmp_path / "other.model", 20, "char")
    with pytest.raises(UserError, match="tokenizer has"):
        save_lm(lm, other.path, tmp_path / "lm2")


def test_a_pickle_in_an_lm_directory_is_refused(tmp_path, char_tokenizer):
    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    assert load_lm(lm_dir)[0].vocab_size == char_tokenizer.vocab_size
    marker = evil_pickle(lm_dir, "state.pickle")
    with pytest.raises(UserError, match=r"state\.pickle: a pickle file in a model directory is refused"):
        load_lm(lm_dir)
    assert not marker.exists()


def test_a_sharded_lm_directory_loads(tmp_path, char_tokenizer):
    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2).eval()
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    config = yaml.safe_load((lm_dir / "config.yaml").read_text())
    write_model_dir(lm_dir, config, lm.state_dict(), lm_dir / "tokenizer.model", max_shard_bytes=4_000)
    assert len(list(lm_dir.glob("model-*.safetensors"))) > 1 and not (lm_dir / "model.safetensors").exists()
    loaded, _ = load_lm(lm_dir)
    tokens = [[5, 6, 7], [8, 9]]
    assert torch.equal(loaded.sentence_nll(tokens), lm.sentence_nll(tokens))


@pytest.mark.parametrize(
    ("change", "message"),
    [({"num_heads": 0}, "num_heads must be at least 1, got 0"), ({"num_layers": -1}, "num_layers must be at least 1")],
)
def test_an_lm_config_with_a_bad_value_is_one_line_naming_it(tmp_path, char_tokenizer, change, message):
    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    config = yaml.safe_load((lm_dir / "config.yaml").read_text())
    config["lm"].update(change)
    (lm_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=rf"^{lm_dir / 'config.yaml'}: bad LM settings \({message}"):
        load_lm(lm_dir)


@pytest.mark.parametrize(("key", "index"), [("out.bias", 5), ("embed.weight", (SOS_EOS_ID, 0)), ("norm.weight", 0)])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_an_lm_with_a_nan_or_inf_weight_is_refused_naming_the_tensor(tmp_path, char_tokenizer, key, index, value):
    """+inf in out.bias or the <sos/eos> embedding row, or NaN anywhere, was fused by default: empty transcripts."""
    from safetensors.torch import load_file, save_file

    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    weights = load_file(lm_dir / "model.safetensors")
    weights[key][index] = value
    save_file(weights, lm_dir / "model.safetensors")
    says = f"{lm_dir / 'model.safetensors'}: weight {key} holds 1 NaN or infinite value (a damaged or diverged model)"
    with pytest.raises(UserError) as caught:
        load_lm(lm_dir)
    assert str(caught.value) == says


@pytest.mark.parametrize("weight", ["1.0e+300", "3.4e+38", "1001", ".nan", "-0.5"])
def test_a_fusion_weight_outside_its_range_is_refused_where_it_is_read(tmp_path, char_tokenizer, weight):
    """1e300 is finite in float64, not in float32; 3.4e38 is finite in float32, its products with log-probabilities
    are not: either emptied every transcript."""
    from srupp_asr.model_files import read_fusion_weight

    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm", fusion_weight=0.5)
    config = lm_dir / "config.yaml"
    config.write_text(config.read_text().replace("fusion_weight: 0.5", f"fusion_weight: {weight}"))
    with pytest.raises(UserError, match=rf"^{config}: fusion_weight must be a number in \[0, 1000\], got "):
        read_fusion_weight(lm_dir)
    with pytest.raises(ValueError, match=r"lm_weight must be a number in \[0, 1000\]"):
        DecodingOptions("joint", lm_weight=float(weight.replace(".nan", "nan")))
    assert DecodingOptions("joint", lm_weight=1000).lm_weight == 1000


def test_an_lm_that_is_a_file_or_whose_config_is_a_pipe_is_named_as_such(tmp_path, char_tokenizer):
    """Both were called "not found"."""
    from srupp_asr.model_files import read_fusion_weight

    (tmp_path / "lm_file").write_text("x")
    for read in (read_fusion_weight, load_lm):
        with pytest.raises(UserError, match=r"lm_file: not a directory \(an LM directory holds config\.yaml"):
            read(tmp_path / "lm_file")
    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    (lm_dir / "config.yaml").unlink()
    os.mkfifo(lm_dir / "config.yaml")
    for read in (read_fusion_weight, load_lm):
        with pytest.raises(UserError, match=r"config\.yaml: LM config is not a regular file \(a pipe; save it"):
            read(lm_dir)


def biased_lm(vocab: int, preferred: int) -> SRUppLM:
    """An LM whose next-token distribution ignores the history and strongly prefers ``preferred`` (and <sos/eos>)."""
    lm = tiny_lm(vocab)
    with torch.no_grad():
        lm.out.weight.zero_()
        lm.out.bias.zero_()
        lm.out.bias[preferred] = 6.0
        lm.out.bias[2] = 3.0
    return lm


def test_shallow_fusion_adds_the_weighted_lm_score_and_flips_an_acoustic_tie() -> None:
    # Two frames; tokens 3 and 4 are equally likely in frame 0, blank in frame 1: CTC alone cannot tell [3] from [4].
    V = 6
    probs = torch.full((1, 2, V), 0.01)
    probs[0, 0, 3] = probs[0, 0, 4] = 0.47
    probs[0, 1, 0] = 0.95
    log_probs = (probs / probs.sum(-1, keepdim=True)).log()
    lengths = torch.tensor([2])
    lm = biased_lm(V, preferred=4)
    for weight in (0.0, 0.5):
        scorers = [(CTCPrefixScorer(log_probs, lengths), 1.0), (LMScorer(lm), weight)]
        (best, score), *_ = beam_search(scorers, 1, lengths, V, beam=4, nbest=2)[0]
        if weight == 0.0:
            continue
        assert best == [4]
        with torch.no_grad():
            lm_logp = -float(lm.sentence_nll([[4]])[0])
        p = log_probs[0].exp()
        ctc = math.log(float(p[0, 4] * p[1, 0] + p[0, 4] * p[1, 4] + p[0, 0] * p[1, 4]))  # paths "4-", "44", "-4"
        assert score == pytest.approx(ctc + weight * lm_logp, abs=1e-4)


def test_every_beam_mode_fuses_the_lm_and_prefix_beam_matches_joint_with_ctc_only() -> None:
    torch.manual_seed(0)
    V = 12
    model = ASRModel(V, d_model=32, encoder_conf={"num_layers": 2, "attn_dim": 16}, decoder_conf={"d_model": 32})
    model.eval()
    enc = torch.randn(2, 9, model.encoder.output_size)
    enc_lens = torch.tensor([9, 6])
    tokenizer = type("Tok", (), {"decode": lambda self, ids: " ".join(map(str, ids)), "id_to_piece": str})()
    lm = biased_lm(V, preferred=7)
    with torch.inference_mode():
        prefix = decode_encoded(
            model, tokenizer, enc, enc_lens, DecodingOptions("ctc_prefix_beam", beam=10, lm_weight=0.5), lm
        )
        joint = decode_encoded(
            model, tokenizer, enc, enc_lens, DecodingOptions("joint", beam=10, ctc_weight=1.0, lm_weight=0.5), lm
        )
        plain = decode_encoded(model, tokenizer, enc, enc_lens, DecodingOptions("ctc_prefix_beam", beam=10))
        rescored = decode_encoded(
            model,
            tokenizer,
            enc,
            enc_lens,
            DecodingOptions("rescoring", beam=10, ctc_weight=1.0, lm_weight=0.5, nbest=3),
            lm,
        )
        reference = decode_encoded(
            model, tokenizer, enc, enc_lens, DecodingOptions("ctc_prefix_beam", beam=10, nbest=10)
        )
    for a, b in zip(prefix, joint, strict=True):
        assert a[0].tokens == b[0].tokens and a[0].score == pytest.approx(b[0].score, abs=1e-4)
    # The LM prefers token 7: fusion gives at least as many 7s as decoding without it.
    assert sum(h[0].tokens.count(7) for h in prefix) >= sum(h[0].tokens.count(7) for h in plain)
    # Rescoring: each n-best entry's score is its CTC score plus lm_weight * log P_lm.
    for hyps, ref in zip(rescored, reference, strict=True):
        ctc = {tuple(h.tokens): h.score for h in ref}
        for h in hyps:
            lm_logp = -float(lm.sentence_nll([h.tokens])[0])
            assert h.score == pytest.approx(ctc[tuple(h.tokens)] + 0.5 * lm_logp, abs=1e-3)


def test_fusion_options_are_checked() -> None:
    with pytest.raises(ValueError, match="lm_weight needs a beam mode"):
        DecodingOptions("ctc_greedy", lm_weight=0.3)
    with pytest.raises(ValueError, match="lm_weight must be"):
        DecodingOptions("joint", lm_weight=-1.0)
    model = ASRModel(12, d_model=32, encoder_conf={"num_layers": 1, "attn_dim": 16}, decoder_conf={"d_model": 32})
    with pytest.raises(ValueError, match="needs a language model"):
        decode_encoded(model, None, torch.randn(1, 4, 32), torch.tensor([4]), DecodingOptions("joint", lm_weight=0.3))
    with pytest.raises(ValueError, match="the LM has 30 tokens"):
        decode_encoded(
            model, None, torch.randn(1, 4, 32), torch.tensor([4]), DecodingOptions("joint", lm_weight=0.3), tiny_lm(30)
        )


def test_transcribe_and_evaluate_fuse_an_lm_from_the_command_line(overfit_model_dir, tmp_path: Path, capsys) -> None:
    from srupp_asr.text import normalize_text
    from tests.helpers import SENTENCES as SPOKEN

    model_dir, utterances = overfit_model_dir
    text = tmp_path / "lm.txt"
    text.write_text("\n".join(SPOKEN) + "\n")
    lm_dir = tmp_path / "lm"
    argv = ["train-lm", "--tokenizer", str(model_dir / "tokenizer.model"), "--train-text", str(text)]
    argv += ["--valid-text", str(text), "--out-dir", str(lm_dir), "--d-model", "32", "--num-layers", "1"]
    argv += ["--attn-dim", "16", "--num-heads", "2", "--max-epochs", "3", "--log-every", "0"]
    assert main(argv) == 0
    assert "best valid perplexity" in capsys.readouterr().out
    wav, reference = utterances[0]
    decode = ["--model", str(model_dir), "--decoding", "joint", "--ctc-weight", "0.5", "--beam", "4"]
    assert main(["transcribe", str(wav), *decode, "--lm", str(lm_dir), "--lm-weight", "0.1", "-q"]) == 0
    assert normalize_text(capsys.readouterr().out) == normalize_text(reference)

    assert main(["transcribe", str(wav), *decode, "--lm-weight", "0.1", "-q"]) == 2
    assert "--lm-weight needs --lm" in capsys.readouterr().err
    other_tok = Tokenizer.train(["zzz yyy"] * 5, tmp_path / "other.model", 8, "char")
    save_lm(tiny_lm(other_tok.vocab_size), other_tok.path, tmp_path / "other_lm")
    assert main(["transcribe", str(wav), *decode, "--lm", str(tmp_path / "other_lm"), "-q"]) == 2
    assert "the LM's tokenizer differs" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ an LM in a model directory


@pytest.fixture()
def shipped(tokenizer: Tokenizer, tmp_path: Path) -> dict[str, Path]:
    """A tiny random ASR model directory without an LM (``plain``), the same with ``lm/`` (``with_lm``: an LM that
    strongly prefers one piece, default weight 2), that LM's own directory (``lm``) and 1.5 s of noise (``wav``)."""
    import numpy as np
    import soundfile as sf

    from srupp_asr.average import ship_lm
    from srupp_asr.model_dir import export_model

    torch.manual_seed(0)
    model = ASRModel(tokenizer.vocab_size, d_model=32, encoder_conf={"num_layers": 1, "attn_dim": 16})
    model.set_cmvn(torch.zeros(80), torch.ones(80))
    plain = export_model(model.state_dict(), model.config, tokenizer.path, tmp_path / "plain")
    with_lm = export_model(model.state_dict(), model.config, tokenizer.path, tmp_path / "with_lm")
    lm = save_lm(biased_lm(tokenizer.vocab_size, tokenizer.encode("t")[-1]), tokenizer.path, tmp_path / "lm")
    ship_lm(with_lm, lm, weight=2.0, dtype=torch.float32)
    wav = tmp_path / "noise.wav"
    sf.write(wav, np.random.default_rng(0).normal(0, 0.1, 24000).astype("float32"), 16000)
    return {"plain": plain, "with_lm": with_lm, "lm": lm, "wav": wav}


def _texts(model_dir: Path, wav: Path, **options) -> tuple[str, dict]:
    from srupp_asr.transcribe import transcribe

    (t,) = transcribe([wav], model_dir, device="cpu", beam=3, **options)
    return t.text, t.decoding


def test_a_model_directorys_lm_is_fused_by_default_as_with_lm_and_off_with_no_lm(shipped) -> None:
    wav = shipped["wav"]
    default, settings = _texts(shipped["with_lm"], wav)
    assert settings["lm"] == str(shipped["with_lm"] / "lm") and settings["lm_weight"] == 2.0
    assert _texts(shipped["with_lm"], wav, lm=shipped["with_lm"] / "lm") == (default, settings)
    assert _texts(shipped["plain"], wav, lm=shipped["lm"], lm_weight=2.0)[0] == default
    without = _texts(shipped["plain"], wav)
    assert "lm" not in without[1] and without[1]["lm_weight"] == 0.0
    assert default != without[0]  # the LM changed the result (it prefers one letter)
    for off in ({"no_lm": True}, {"lm_weight": 0.0}):
        text, decoding = _texts(shipped["with_lm"], wav, **off)
        assert (text, decoding) == without, off
    # another weight for the same LM, and ctc_greedy (which takes no LM) with a model that carries one
    assert _texts(shipped["with_lm"], wav, lm_weight=0.5)[1]["lm_weight"] == 0.5
    greedy = _texts(shipped["with_lm"], wav, decoding="ctc_greedy")
    assert greedy == _texts(shipped["plain"], wav, decoding="ctc_greedy") and "lm" not in greedy[1]


def test_the_loaded_api_model_fuses_its_lm_and_keeps_it(shipped) -> None:
    import srupp_asr

    model = srupp_asr.load_model(shipped["with_lm"], device="cpu")
    first = model.transcribe(str(shipped["wav"]), beam=3)
    assert first.decoding["lm"] == str(shipped["with_lm"] / "lm")
    assert first.text == _texts(shipped["with_lm"], shipped["wav"])[0]
    assert model.transcribe(str(shipped["wav"]), beam=3, no_lm=True).text == _texts(shipped["plain"], shipped["wav"])[0]
    assert len(model._lms) == 1  # loaded once, reused by the next call
    model.transcribe(str(shipped["wav"]), beam=3)
    assert len(model._lms) == 1


def test_shipped_lm_problems_are_one_line_errors(shipped, tokenizer: Tokenizer, tmp_path: Path, capsys) -> None:
    wav, model_dir = str(shipped["wav"]), shipped["with_lm"]
    base = ["transcribe", wav, "--model", str(model_dir), "--device", "cpu", "--beam", "3", "-q"]
    assert main(base[:-1]) == 0  # the closing line names the LM fused
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("transcribed 1 file: ") and last.endswith(
        f"; language model {model_dir / 'lm'} (weight 2; --no-lm: without)"
    )
    assert main([*base, "--no-lm", "--lm", str(shipped["lm"])]) == 2
    assert (
        capsys.readouterr().err
        == "srupp-asr transcribe: error: decoding options: --no-lm and --lm contradict each other\n"
    )
    assert main(["transcribe", wav, "--model", str(shipped["plain"]), "--lm-weight", "0.4", "-q"]) == 2
    assert "--lm-weight needs --lm" in capsys.readouterr().err
    assert main([*base, "--lm-weight", "-1"]) == 2
    assert "lm_weight must be a number in [0, 1000], got -1.0" in capsys.readouterr().err

    # an lm/ trained with another tokenizer
    other_tok = Tokenizer.train(["zzz yyy"] * 5, tmp_path / "other.model", 8, "char")
    save_lm(tiny_lm(other_tok.vocab_size), other_tok.path, model_dir / "lm")
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{model_dir / 'lm'}: the LM's tokenizer differs" in err
    assert main([*base, "--no-lm"]) == 0  # an unusable lm/ is never read when it is turned off
    capsys.readouterr()

    # a corrupt lm/: its weights cut short, then its config unreadable
    save_lm(tiny_lm(tokenizer.vocab_size), tokenizer.path, model_dir / "lm")
    weights = model_dir / "lm" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(weights) in err
    (model_dir / "lm" / "config.yaml").write_text("fusion_weight: [\n")
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(model_dir / "lm" / "config.yaml") in err


def test_evaluate_fuses_a_model_directorys_lm_by_default(shipped, tmp_path: Path, capsys) -> None:
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    rec = Recording.from_file(shipped["wav"], recording_id="noise")
    sup = SupervisionSegment(id="noise", recording_id="noise", start=0.0, duration=rec.duration, text="a cat")
    cuts = tmp_path / "cuts.jsonl.gz"
    CutSet.from_cuts([MonoCut("noise", 0.0, rec.duration, 0, recording=rec, supervisions=[sup])]).to_file(cuts)
    hyps = {}
    for name, extra in {
        "default": [],
        "with": ["--lm", str(shipped["lm"]), "--lm-weight", "2"],
        "no": ["--no-lm"],
    }.items():
        argv = ["evaluate", "--model", str(shipped["with_lm"]), "--cuts", str(cuts), "--out-dir", str(tmp_path / name)]
        assert main([*argv, "--device", "cpu", "--beam", "3", *extra]) == 0
        out = capsys.readouterr().out
        assert ("with the language model" in out) == (name != "no"), out
        hyps[name] = (tmp_path / name / "hyp.jsonl").read_text()
    assert hyps["default"] == hyps["with"] != hyps["no"]


# ------------------------------------------------ shallow fusion's scores against the LM's own log-probabilities


def test_lm_alone_beam_scores_are_whole_sentence_log_probs_with_end_of_sentence() -> None:
    lm = tiny_lm(12)
    with torch.no_grad():
        nbest = beam_search([(LMScorer(lm), 1.0)], 2, torch.tensor([3, 5]), 12, beam=6, nbest=6)
        for hyps in nbest:
            assert len(hyps) == 6 and [] in [y for y, _ in hyps]  # the empty hypothesis: log P(<sos/eos> | <sos/eos>)
            for y, score in hyps:
                assert len(y) <= 5
                assert score == pytest.approx(-float(lm.sentence_nll([y])[0]), abs=1e-5), y


def test_an_empty_hypothesis_gets_the_lm_end_of_sentence_score_in_every_beam_mode() -> None:
    V, weight = 12, 0.5
    lm = biased_lm(V, preferred=7)
    log_probs = torch.full((1, 5, V), -9.0)
    log_probs[..., 0] = 0.0  # every frame blank: CTC says nothing was said
    log_probs = log_probs.log_softmax(-1)
    lengths = torch.tensor([5])
    with torch.no_grad():
        lm_empty = -float(lm.sentence_nll([[]])[0])
        ctc_empty = float(log_probs[0, :, 0].sum())
        (best, score), *_ = beam_search(
            [(CTCPrefixScorer(log_probs, lengths), 1.0), (LMScorer(lm), weight)], 1, lengths, V, beam=4, nbest=3
        )[0]
        assert best == [] and score == pytest.approx(ctc_empty + weight * lm_empty, abs=1e-4)
        model = ASRModel(V, d_model=32, encoder_conf={"num_layers": 1, "attn_dim": 16}, decoder_conf={"d_model": 32})
        model.eval()
        model.ctc_log_probs = lambda enc: log_probs  # the CTC head's output, as above
        tok = types.SimpleNamespace(decode=lambda ids: " ".join(map(str, ids)), id_to_piece=str)
        enc = torch.randn(1, 5, model.encoder.output_size)
        for mode in ("ctc_prefix_beam", "rescoring"):
            options = DecodingOptions(mode, beam=4, ctc_weight=1.0, lm_weight=weight)
            (hyp,) = decode_encoded(model, tok, enc, lengths, options, lm)[0]
            assert hyp.tokens == [] and hyp.score == pytest.approx(ctc_empty + weight * lm_empty, abs=1e-4), mode


def test_joint_scores_decompose_into_attention_ctc_and_lm_with_end_of_sentence_and_batching_changes_nothing() -> None:
    torch.manual_seed(0)
    V, w, lm_w, penalty = 12, 0.3, 0.5, 0.2
    model = ASRModel(V, d_model=32, encoder_conf={"num_layers": 2, "attn_dim": 16}, decoder_conf={"d_model": 32})
    model.eval()
    lm = tiny_lm(V)
    enc = torch.randn(3, 9, model.encoder.output_size)
    enc_lens = torch.tensor([9, 6, 4])
    tok = types.SimpleNamespace(decode=lambda ids: " ".join(map(str, ids)), id_to_piece=str)
    with torch.inference_mode():
        log_probs = model.ctc_log_probs(enc)
        joint = DecodingOptions("joint", beam=4, nbest=4, ctc_weight=w, lm_weight=lm_w, length_penalty=penalty)
        batched = decode_encoded(model, tok, enc, enc_lens, joint, lm)
        for b, hyps in enumerate(batched):
            T = int(enc_lens[b])
            for h in hyps:
                y = torch.tensor([h.tokens])
                att = attention_scores(model.decoder, enc[b : b + 1], enc_lens[b : b + 1], [[h.tokens]])[0][0]
                ctc = -float(
                    F.ctc_loss(
                        log_probs[b, :T, None], y, torch.tensor([T]), torch.tensor([len(h.tokens)]), reduction="sum"
                    )
                )
                lm_logp = -float(lm.sentence_nll([h.tokens])[0])
                expected = (1 - w) * att + w * ctc + lm_w * lm_logp + penalty * len(h.tokens)
                assert h.score == pytest.approx(expected, abs=1e-3), h.tokens
        for options in (
            joint,
            DecodingOptions("ctc_prefix_beam", beam=4, nbest=3, lm_weight=lm_w),
            DecodingOptions("rescoring", beam=4, nbest=3, ctc_weight=w, lm_weight=lm_w),
        ):
            batch = decode_encoded(model, tok, enc, enc_lens, options, lm)
            for b in range(3):
                alone = decode_encoded(model, tok, enc[b : b + 1, : int(enc_lens[b])], enc_lens[b : b + 1], options, lm)
                assert [h.tokens for h in alone[0]] == [h.tokens for h in batch[b]], options.mode
                for x, y in zip(alone[0], batch[b], strict=True):
                    assert x.score == pytest.approx(y.score, abs=1e-4), options.mode
