"""The SRU++ language model: step-by-step scoring equals the whole-sentence forward, LM directories round-trip (from
shards too) and refuse what is not theirs (a pickle, bad settings), ``train-lm`` learns and resumes, and shallow
fusion adds ``lm_weight * log P_lm`` in every beam mode.

The last class checks ``train-lm`` like the ASR trainer, against independent references: a run stopped in any way
(SIGTERM or Ctrl-C after a step or during validation, ``--max-time``, ``kill -9`` after or during a save) and
resumed ends with bitwise the weights, optimiser state, random generator states and best LM of a run never stopped;
its state file is written atomically and read safely, and a resume with other settings is refused naming the file.
The validation perplexity equals a float64 step-by-step computation, and shallow fusion's scores are the LM's
whole-sentence log-probabilities, ``<sos/eos>`` included, in every beam mode, batched or not."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.callbacks import timer

from srupp_asr.cli import main
from srupp_asr.decoding import DecodingOptions, decode_encoded
from srupp_asr.decoding.beam_search import beam_search
from srupp_asr.decoding.rescoring import attention_scores
from srupp_asr.decoding.scorers import CTCPrefixScorer, LMScorer
from srupp_asr.errors import UserError
from srupp_asr.lm import SOS_EOS_ID, SRUppLM, load_lm, save_lm
from srupp_asr.lm_lightning import evaluate_perplexity, make_batches
from srupp_asr.lm_train import LMTrainConfig, train_lm
from srupp_asr.model import ASRModel
from srupp_asr.model_dir import write_model_dir
from srupp_asr.schedulers import NoamLR
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
    from srupp_asr.lm import read_fusion_weight

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
    from srupp_asr.lm import read_fusion_weight

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


def test_batches_group_by_length_within_the_token_budget() -> None:
    sentences = [[1] * n for n in (3, 10, 1, 7, 7, 2, 30)]
    batches = make_batches(sentences, batch_tokens=16)
    assert sorted(i for b in batches for i in b) == list(range(len(sentences)))
    for batch in batches:
        width = max(len(sentences[i]) + 1 for i in batch)
        assert width * len(batch) <= 16 or len(batch) == 1


def test_train_lm_learns_the_text_and_resumes(tokenizer: Tokenizer, tmp_path: Path) -> None:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    cfg = LMTrainConfig(
        tokenizer=str(tokenizer.path),
        out_dir=str(tmp_path / "lm"),
        train_text=[str(text)],
        valid_text=[str(text)],
        d_model=32,
        num_layers=2,
        attn_dim=16,
        num_heads=2,
        dropout=0.0,
        batch_tokens=200,
        lr=0.01,
        warmup_steps=10,
        max_epochs=15,
    )
    result = train_lm(cfg)
    # Uniform guessing over the pieces would be ~vocab_size; the memorised text is far more predictable.
    assert result["best_valid_ppl"] < 3.0, result
    lm, _ = load_lm(tmp_path / "lm")
    nll = lm.sentence_nll([tokenizer.encode("the cat sat on the mat"), tokenizer.encode("mat the on sat cat the")])
    assert nll[0] < nll[1] - 5.0  # a seen sentence is far likelier than its words reversed
    state = Path(f"{cfg.out_dir}.train.pt")
    assert state.is_file()
    cfg.max_epochs, cfg.resume = 16, True
    resumed = train_lm(cfg)
    assert resumed["epochs"] == 16 and resumed["steps"] > result["steps"]


def test_train_lm_command_errors_are_one_line(tokenizer: Tokenizer, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    text = tmp_path / "text.txt"
    text.write_text("the cat\n")
    base = ["train-lm", "--tokenizer", str(tokenizer.path), "--out-dir", str(tmp_path / "lm")]
    cases = [
        ([*base, "--valid-text", str(empty)], "give training text"),
        ([*base, "--train-text", str(empty), "--valid-text", str(empty)], "no non-empty sentence"),
        ([*base, "--train-text", str(tmp_path / "nope.txt"), "--valid-text", str(empty)], "nope.txt: cannot read"),
        ([*base, "--train-text", str(text), "--valid-text", str(text), "--resume"], "no training state to resume"),
        (
            [*base, "--train-text", str(empty), "--valid-text", str(empty), "--num-heads", "3"],
            "--num-heads must divide",
        ),
    ]
    # Checked before any text is read (these once were ValueError tracebacks from the optimiser or the layers).
    for option, value, message in [
        ("--lr", "-1", "--lr must be a finite number > 0, got -1.0"),
        ("--lr", "nan", "--lr must be a finite number > 0, got nan"),
        ("--dropout", "2", "--dropout must be a finite number >= 0 and < 1, got 2.0"),
        ("--warmup-steps", "0", "--warmup-steps must be at least 1, got 0"),
        ("--clip", "-1", "--clip must be a finite number > 0, got -1.0"),
        ("--attn-every", "-1", "--attn-every must be non-negative, got -1"),
    ]:
        cases.append(([*base, "--train-text", str(empty), "--valid-text", str(empty), option, value], message))
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


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
        prefix = decode_encoded(model, tokenizer, enc, enc_lens, DecodingOptions("ctc_prefix_beam", lm_weight=0.5), lm)
        joint = decode_encoded(
            model, tokenizer, enc, enc_lens, DecodingOptions("joint", ctc_weight=1.0, lm_weight=0.5), lm
        )
        plain = decode_encoded(model, tokenizer, enc, enc_lens, DecodingOptions("ctc_prefix_beam"))
        rescored = decode_encoded(
            model, tokenizer, enc, enc_lens, DecodingOptions("rescoring", ctc_weight=1.0, lm_weight=0.5, nbest=3), lm
        )
        reference = decode_encoded(model, tokenizer, enc, enc_lens, DecodingOptions("ctc_prefix_beam", nbest=10))
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


SIGTERM_AT_STEP_3 = """
import os, signal, sys
from srupp_asr.cli import _run
from srupp_asr.lm_train import LMTrainConfig, train_lm
from srupp_asr.schedulers import NoamLR

step = NoamLR.step
def step_and_signal(self, *args, **kwargs):  # `kill PID` as step 3 ends
    step(self, *args, **kwargs)
    if self.last_epoch == 3:
        os.kill(os.getpid(), signal.SIGTERM)
NoamLR.step = step_and_signal
tokenizer, out, text = sys.argv[1:]
cfg = LMTrainConfig(tokenizer=tokenizer, out_dir=out, train_text=[text], valid_text=[text], d_model=16, num_layers=1,
                    attn_dim=8, num_heads=2, batch_tokens=40, max_epochs=50)
sys.exit(_run("train-lm", lambda: train_lm(cfg)))
"""


def test_sigterm_stops_train_lm_after_the_step_with_its_state_saved(tokenizer: Tokenizer, tmp_path: Path) -> None:
    import subprocess
    import sys

    text = tmp_path / "train.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "lm"
    args = [sys.executable, "-c", SIGTERM_AT_STEP_3, str(tokenizer.path), str(out), str(text)]
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=120)
    state = Path(f"{out}.train.pt")
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"srupp-asr train-lm: terminated (SIGTERM) after step 3: saved {state}; resume with --resume"
    )
    assert torch.load(state, weights_only=True)["global_step"] == 3


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


# ------------------------------------------ train-lm stopped and resumed against an unstopped run; float64 references


ROOT = Path(__file__).resolve().parent.parent
MAX_EPOCHS = 3
# Dropout on (the generator states matter), a validation every 4 steps (periodic saves), 18 steps per epoch.
OPTIONS = ["--d-model", "16", "--num-layers", "2", "--attn-dim", "8", "--num-heads", "2", "--dropout", "0.2"]
OPTIONS += ["--batch-tokens", "60", "--lr", "0.01", "--warmup-steps", "5", "--valid-every", "4", "--log-every", "0"]


@pytest.fixture(scope="module")
def lm_corpus(tmp_path_factory) -> tuple[Path, Path]:
    """``(tokenizer, text)``: a character tokenizer of :data:`SENTENCES` and the sentences as a text file."""
    folder = tmp_path_factory.mktemp("lm_audit")
    tok = Tokenizer.train(SENTENCES, folder / "tokenizer.model", 40, "char")
    text = folder / "train.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    return tok.path, text


STEPS_PER_EPOCH = 18
STEPS = MAX_EPOCHS * STEPS_PER_EPOCH
# The steps after which the runs validate (and save their state): every 4 batches of an epoch and at its end.
VALIDATIONS = sorted({e * STEPS_PER_EPOCH + b for e in range(MAX_EPOCHS) for b in (4, 8, 12, 16, STEPS_PER_EPOCH)})


def argv(lm_corpus, out: Path, *extra: str, epochs: int = MAX_EPOCHS) -> list[str]:
    tok, text = lm_corpus
    args = ["train-lm", "--tokenizer", str(tok), "--train-text", str(text), "--valid-text", str(text)]
    return [*args, "--out-dir", str(out), *OPTIONS, "--max-epochs", str(epochs), *extra]


def state_of(out: Path) -> dict:
    return torch.load(f"{out}.train.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def reference(lm_corpus, tmp_path_factory) -> tuple[dict, dict]:
    """The final state and best LM of a run never stopped."""
    out = tmp_path_factory.mktemp("lm_reference") / "lm"
    assert main(argv(lm_corpus, out)) == 0
    return state_of(out), load_lm(out)[0].state_dict()


def progress(state: dict) -> dict:
    """Where a saved run stands: Lightning's step and epoch, the data module's place in its epoch, the best ppl."""
    return {
        "step": state["global_step"],
        "epoch": state["epoch"],
        "data": state["LMDataModule"],
        "best": state["train_lm"]["best"],
    }


def assert_same_run(out: Path, reference: tuple[dict, dict]) -> None:
    """Bitwise the reference run's weights, optimiser state, generator state, progress and best LM."""
    ref, ref_lm = reference
    got = state_of(out)
    for key, value in ref["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), (key, float((got["state_dict"][key] - value).abs().max()))
    for i, slot in ref["optimizer_states"][0]["state"].items():
        for name, value in slot.items():
            assert torch.equal(got["optimizer_states"][0]["state"][i][name], value), (i, name)
    assert got["lr_schedulers"][0]["last_epoch"] == ref["lr_schedulers"][0]["last_epoch"]
    # dropout drew exactly what it drew in the reference
    assert torch.equal(got["rng_states"]["torch"], ref["rng_states"]["torch"])
    assert progress(got) == progress(ref)
    for key, value in load_lm(out)[0].state_dict().items():
        assert torch.equal(value, ref_lm[key]), key


class Killed(BaseException):
    """Stands for ``kill -9``: nothing in train-lm catches it, nothing is saved."""


# Scenarios: {step: how the run is stopped as that step ends}; the run is resumed until it completes.
# term / int: SIGTERM / Ctrl-C; kill: kill -9 (the state on disk is the last validation's); time: --max-time runs
# out (resumed with a larger one); valterm: SIGTERM during the next validation (after its first batch).
SCENARIOS = {
    "sigterm-mid-epoch": {5: "term"},
    "sigterm-at-epoch-end": {18: "term"},
    "ctrl-c-mid-epoch": {21: "int"},
    "kill-9-after-a-periodic-save": {6: "kill"},
    "max-time-mid-epoch": {7: "time"},
    "max-time-at-epoch-end": {18: "time"},
    "sigterm-during-a-mid-epoch-validation": {8: "valterm"},
    "sigterm-during-an-epoch-end-validation": {36: "valterm"},
    "sigterm-kill-9-max-time-in-a-row": {3: "term", 11: "kill", 30: "time"},
}


STOP_IN_A_CHILD = """
import os, signal, sys, torch
from srupp_asr.cli import main
from srupp_asr.lightning_checkpoints import AtomicCheckpointIO
from srupp_asr.schedulers import NoamLR

how, argv = sys.argv[1], sys.argv[2:]
step, save = NoamLR.step, torch.save
def step_and_signal(self, *args, **kwargs):
    step(self, *args, **kwargs)
    if self.last_epoch == 6 and how != "kill-9-mid-save":
        os.kill(os.getpid(), {"sigterm": signal.SIGTERM, "ctrl-c": signal.SIGINT}[how])
def half_a_save_then_kill_9(self, checkpoint, tmp):  # the second state save (step 8): killed half-way
    dump(self, checkpoint, tmp)
    if checkpoint["global_step"] == 8:
        with open(tmp, "r+b") as f:
            f.truncate(os.path.getsize(tmp) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
NoamLR.step = step_and_signal
dump = AtomicCheckpointIO._dump
AtomicCheckpointIO._dump = half_a_save_then_kill_9
sys.exit(main(argv))
"""


def float64_perplexity(lm: SRUppLM, sentences: list[list[int]]) -> float:
    """exp(sum of -log p(y_t | y_<t) over every token and the final <sos/eos> / their number), one token at a time
    in float64 through :meth:`SRUppLM.step` (not the batched, padded forward that validation runs)."""
    ref = SRUppLM(**lm.config).double().eval()
    ref.load_state_dict(lm.state_dict())
    total, count = 0.0, 0
    with torch.no_grad():
        for y in sentences:
            states, token = None, torch.tensor([SOS_EOS_ID])
            for target in [*y, SOS_EOS_ID]:
                h, states = ref.body.step(ref.embed(token), states)
                total -= float(torch.log_softmax(ref.out(ref.norm(h)), -1)[0, target])
                count += 1
                token = torch.tensor([target])
    return math.exp(total / count)


@pytest.fixture(scope="module")
def one_thread():
    """One CPU thread here and in the children (OMP_NUM_THREADS, below): the runs compared bitwise then run alike,
    and tiny models train several times faster on a busy machine than with threads waiting for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
class TestAgainstAnUnstoppedRunAndFloat64References:
    """One CPU thread here (one_thread): the runs compared bitwise run alike."""

    @pytest.mark.parametrize("name", list(SCENARIOS))
    def test_a_stopped_and_resumed_run_ends_bitwise_where_an_unstopped_one_does(
        self, name, lm_corpus, reference, tmp_path, monkeypatch
    ) -> None:
        # Was: the random generator state (dropout) was not saved and a resumed run reseeded it: weights 0.026-0.15 off.
        actions = dict(SCENARIOS[name])
        clock = {"now": 0.0}
        monkeypatch.setattr(timer, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))
        step, nll = NoamLR.step, SRUppLM.sentence_nll
        armed = {"valterm": False}
        budget = {"minutes": 1}

        def step_and_stop(self, *args, **kwargs):
            step(self, *args, **kwargs)
            action = actions.pop(self.last_epoch, None)
            if action == "term":
                signal.raise_signal(signal.SIGTERM)
            elif action == "int":
                signal.raise_signal(signal.SIGINT)
            elif action == "kill":
                raise Killed
            elif action == "time":
                clock["now"] = budget["minutes"] * 60 + 1
            elif action == "valterm":
                armed["valterm"] = True

        def nll_and_stop(self, sentences):
            if armed["valterm"] and not self.training:
                armed["valterm"] = False
                signal.raise_signal(signal.SIGTERM)
            return nll(self, sentences)

        monkeypatch.setattr(NoamLR, "step", step_and_stop)
        monkeypatch.setattr(SRUppLM, "sentence_nll", nll_and_stop)
        out = tmp_path / "lm"
        stops, resume = [], []
        for _ in range(5):
            clock["now"] = 0.0
            try:
                status = main(argv(lm_corpus, out, "--max-time", str(budget["minutes"]), *resume))
            except Killed:
                status = "killed"
            stops.append((status, state_of(out)["global_step"]))
            # finished as asked (all epochs, or --max-time) marks OUT.train.done; a stop, a kill, a run under way do not
            assert Path(f"{out}.train.done").is_file() == (status == 0), (status, stops)
            resume = ["--resume"]
            if status == 0 and stops[-1][1] == STEPS:
                break
            budget["minutes"] *= 10  # --max-time counts every resume's training time: a stopped run gets more
        assert not actions, f"stops not reached: {actions}"
        # Each stop saved the state where it should: at the step (SIGTERM, Ctrl-C, --max-time, SIGTERM during the
        # validation after it), or at the last validation before it (kill -9).
        expected = {"term": 143, "int": 130, "kill": "killed", "time": 0, "valterm": 143}
        for (step, action), (status, saved_at) in zip(SCENARIOS[name].items(), stops, strict=False):
            assert status == expected[action], stops
            assert saved_at == (max(v for v in VALIDATIONS if v <= step) if action == "kill" else step), stops
        assert len(stops) == len(SCENARIOS[name]) + 1 and stops[-1][0] == 0, stops
        assert_same_run(out, reference)
        done = json.loads(Path(f"{out}.train.done").read_text())
        assert done["steps"] == STEPS and done["epochs"] == MAX_EPOCHS
        assert done["best_valid_ppl"] == reference[0]["train_lm"]["best"] and done["state"] == f"{out}.train.pt"

    @pytest.mark.process  # a training child stopped by a real signal (kill -9 too), then resumed
    @pytest.mark.parametrize(
        ("how", "status", "line"),
        [
            ("sigterm", 143, "terminated (SIGTERM) after step 6"),
            ("ctrl-c", 130, "interrupted (Ctrl-C) after step 6"),
            ("kill-9-mid-save", -9, None),
        ],
    )
    def test_a_real_signal_in_a_child_then_resume_matches_the_unstopped_run(
        self, how, status, line, lm_corpus, reference, tmp_path
    ) -> None:
        out = tmp_path / "lm"
        state = Path(f"{out}.train.pt")
        args = [sys.executable, "-c", STOP_IN_A_CHILD, how, *argv(lm_corpus, out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == status, proc.stderr[-2000:]
        if line is not None:
            last = proc.stderr.strip().splitlines()[-1]
            assert last == f"srupp-asr train-lm: {line}: saved {state}; resume with --resume", last
            assert state_of(out)["global_step"] == 6
        else:  # the kill left the step-4 state whole, and a half-written hidden temporary file beside it
            assert state_of(out)["global_step"] == 4
            assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.suffix == ".partial"]
        assert main(argv(lm_corpus, out, "--resume")) == 0
        assert_same_run(out, reference)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.suffix == ".partial"]  # swept

    def test_a_resume_with_other_settings_is_refused_naming_the_state_file(self, lm_corpus, tmp_path, capsys) -> None:
        # Was: only the LM's shape was compared; another --lr, --batch-tokens, --seed, tokenizer with as many pieces,
        # or text was silently trained on from the saved position (the optimiser's saved lr even overrode --lr).
        out = tmp_path / "lm"
        state = f"{out}.train.pt"
        assert main(argv(lm_corpus, out, epochs=1)) == 0
        tok = lm_corpus[0]
        other_text = tmp_path / "other.txt"
        other_text.write_text("\n".join(SENTENCES[:-1]) + "\n")
        same_chars = "\n".join([*SENTENCES, "ooooo ddddd tttttt"])  # the same characters, other counts: other pieces
        other_tok = Tokenizer.train(same_chars.splitlines(), tmp_path / "other_tok.model", 40, "char")
        assert other_tok.vocab_size == Tokenizer(tok).vocab_size
        hint = "resume with the saved run's options, or start afresh without --resume"
        base = argv(lm_corpus, out, "--resume")
        cases = [
            (["--d-model", "32"], "saved with --d-model 16, now 32"),
            (["--dropout", "0.1"], "saved with --dropout 0.2, now 0.1"),
            (["--batch-tokens", "80"], "saved with --batch-tokens 60, now 80"),
            (["--lr", "0.02"], "saved with --lr 0.01, now 0.02"),
            (["--warmup-steps", "6"], "saved with --warmup-steps 5, now 6"),
            (["--seed", "1"], "saved with --seed 0, now 1"),
            (["--clip", "1"], "saved with --clip 5.0, now 1.0"),
            (["--tokenizer", str(other_tok.path)], "saved with another tokenizer"),
            (["--train-text", str(other_text)], "saved for other training text (40 sentences then, 39 now)"),
            (["--valid-text", str(other_text)], "saved for other validation text (40 sentences then, 39 now)"),
        ]
        before = Path(state).read_bytes()
        for extra, message in cases:
            assert main([*base, *extra]) == 2, extra
            err = capsys.readouterr().err.strip()
            assert err == f"srupp-asr train-lm: error: {state}: {message}; {hint}", err
        assert Path(state).read_bytes() == before
        # What may change: the budget, the validation and log schedule, the device.
        assert main([*base, "--max-epochs", "2", "--valid-every", "7", "--log-every", "5", "--device", "cpu"]) == 0

    def test_a_missing_corrupt_or_foreign_state_file_is_one_line_naming_it(self, lm_corpus, tmp_path, capsys) -> None:
        out = tmp_path / "lm"
        state = Path(f"{out}.train.pt")
        base = argv(lm_corpus, out, "--resume")
        assert main(base) == 2
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith(f"{state}: no training state to resume from (run without --resume first)")
        )
        assert main(argv(lm_corpus, out, epochs=1)) == 0
        good = state.read_bytes()
        saved = state_of(out)
        wrong_shape = dict(saved, state_dict=dict(saved["state_dict"], **{"lm.out.bias": torch.zeros(3)}))
        cases = [
            (b"", "empty file (0 bytes), not a checkpoint"),
            (good[: len(good) // 2], "not a readable PyTorch checkpoint"),
            (torch.zeros(3), "not a train-lm state (no state_dict, optimizer_states, lr_schedulers, loops, train_lm)"),
            ({"state_dict": {}}, "not a train-lm state (no optimizer_states, lr_schedulers, loops, train_lm)"),
            (dict(saved, epoch="1"), "not a train-lm state (bad epoch)"),
            (dict(saved, train_lm=dict(saved["train_lm"], best="low")), "not a train-lm state (bad best)"),
            (wrong_shape, "not a usable train-lm state (Error(s) in loading state_dict for LMLightningModule:"),
            (dict(saved, rng_states={"torch": torch.zeros(3)}), "not a usable train-lm state"),
            (types.SimpleNamespace(a=1), "holds Python objects other than tensors and plain data"),
        ]
        for content, message in cases:
            if isinstance(content, bytes):
                state.write_bytes(content)
            else:
                import pickle

                with open(state, "wb") as f:
                    if isinstance(content, types.SimpleNamespace):
                        pickle.dump(content, f, protocol=2)  # a pickled object: weights_only refuses it
                    else:
                        torch.save(content, f)
            assert main(base) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and err.startswith(f"srupp-asr train-lm: error: {state}: "), err
            assert message in err, err

    def test_a_second_train_lm_into_the_same_out_dir_is_refused(self, lm_corpus, tmp_path, capsys) -> None:
        import fcntl

        out = tmp_path / "lm"
        hint = "give this one its own --out-dir"
        fd = os.open(f"{out}.train.lock", os.O_RDWR | os.O_CREAT)
        try:
            os.write(fd, b"4242\n")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a running train-lm holds it
            assert main(argv(lm_corpus, out)) == 2
            err = capsys.readouterr().err.strip()
            assert err == f"srupp-asr train-lm: error: {out}: another train-lm (pid 4242) is training into it; {hint}"
        finally:
            os.close(fd)
        assert main(argv(lm_corpus, out, epochs=1)) == 0  # released with its process (here: its descriptor)

    def test_a_resume_whose_lm_directory_is_gone_writes_one_again(self, lm_corpus, tmp_path, caplog) -> None:
        # Was: the saved best perplexity stood, so a resumed run wrote no LM unless it beat it (and none if finished).
        import shutil

        out = tmp_path / "lm"
        assert main(argv(lm_corpus, out, epochs=1)) == 0
        shutil.rmtree(out)
        assert main(argv(lm_corpus, out, "--resume", epochs=1)) == 0  # the run is finished: nothing left to train
        assert f"{out} holds no LM any more: wrote the saved weights there" in caplog.text
        lm, _ = load_lm(out)
        saved = state_of(out)
        assert all(torch.equal(v, saved["state_dict"][f"lm.{k}"]) for k, v in lm.state_dict().items())
        assert saved["global_step"] == STEPS_PER_EPOCH

    def test_validation_perplexity_equals_a_float64_token_by_token_computation(self) -> None:
        torch.manual_seed(0)
        lm = SRUppLM(30, d_model=32, num_layers=3, attn_dim=16, num_heads=2, dropout=0.3, attn_dropout=0.3)
        for layer in lm.body.layers:
            if layer.attention:
                torch.nn.init.constant_(layer.alpha, 0.7)  # attention on
        g = torch.Generator().manual_seed(1)
        lens = torch.randint(1, 15, (25,), generator=g).tolist()
        sentences = [torch.randint(3, 30, (n,), generator=g).tolist() for n in lens]
        expected = float64_perplexity(lm, sentences)
        lm.train()
        for batch_tokens in (1, 13, 40, 10_000):  # one sentence per batch, padded batches, all in one
            assert evaluate_perplexity(lm, sentences, batch_tokens) == pytest.approx(expected, rel=1e-6)
        assert lm.training  # evaluated in eval mode (no dropout), training mode given back

    def test_lm_alone_beam_scores_are_whole_sentence_log_probs_with_end_of_sentence(self) -> None:
        lm = tiny_lm(12)
        with torch.no_grad():
            nbest = beam_search([(LMScorer(lm), 1.0)], 2, torch.tensor([3, 5]), 12, beam=6, nbest=6)
            for hyps in nbest:
                assert len(hyps) == 6 and [] in [
                    y for y, _ in hyps
                ]  # the empty hypothesis: log P(<sos/eos> | <sos/eos>)
                for y, score in hyps:
                    assert len(y) <= 5
                    assert score == pytest.approx(-float(lm.sentence_nll([y])[0]), abs=1e-5), y

    def test_an_empty_hypothesis_gets_the_lm_end_of_sentence_score_in_every_beam_mode(self) -> None:
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
            model = ASRModel(
                V, d_model=32, encoder_conf={"num_layers": 1, "attn_dim": 16}, decoder_conf={"d_model": 32}
            )
            model.eval()
            model.ctc_log_probs = lambda enc: log_probs  # the CTC head's output, as above
            tok = types.SimpleNamespace(decode=lambda ids: " ".join(map(str, ids)), id_to_piece=str)
            enc = torch.randn(1, 5, model.encoder.output_size)
            for mode in ("ctc_prefix_beam", "rescoring"):
                options = DecodingOptions(mode, beam=4, ctc_weight=1.0, lm_weight=weight)
                (hyp,) = decode_encoded(model, tok, enc, lengths, options, lm)[0]
                assert hyp.tokens == [] and hyp.score == pytest.approx(ctc_empty + weight * lm_empty, abs=1e-4), mode

    def test_joint_scores_decompose_into_attention_ctc_and_lm_with_end_of_sentence_and_batching_changes_nothing(
        self,
    ) -> None:
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
                    alone = decode_encoded(
                        model, tok, enc[b : b + 1, : int(enc_lens[b])], enc_lens[b : b + 1], options, lm
                    )
                    assert [h.tokens for h in alone[0]] == [h.tokens for h in batch[b]], options.mode
                    for x, y in zip(alone[0], batch[b], strict=True):
                        assert x.score == pytest.approx(y.score, abs=1e-4), options.mode
