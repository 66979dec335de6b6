"""``train-lm`` audited like the ASR trainer: a run stopped in any way (SIGTERM or Ctrl-C after a step or during
validation, ``--max-time``, ``kill -9`` after or during a save) and resumed ends with bitwise the weights, optimiser
state, random generator states and best LM of a run never stopped; its state file is written atomically and read
safely, and a resume with other settings is refused naming the file. The validation perplexity equals a float64
step-by-step computation, and shallow fusion's scores are the LM's whole-sentence log-probabilities, ``<sos/eos>``
included, in every beam mode, batched or not."""

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

from srupp_asr import lm_train
from srupp_asr.cli import main
from srupp_asr.decoding import DecodingOptions, decode_encoded
from srupp_asr.decoding.beam_search import beam_search
from srupp_asr.decoding.rescoring import attention_scores
from srupp_asr.decoding.scorers import CTCPrefixScorer, LMScorer
from srupp_asr.lm import SOS_EOS_ID, SRUppLM, load_lm
from srupp_asr.lm_train import evaluate_perplexity
from srupp_asr.model import ASRModel
from srupp_asr.schedulers import NoamLR
from srupp_asr.tokenizer import Tokenizer
from tests.test_lm import SENTENCES, biased_lm, tiny_lm

ROOT = Path(__file__).resolve().parent.parent
MAX_EPOCHS = 3
# Dropout on (the generator states matter), a validation every 4 steps (periodic saves), 18 steps per epoch.
OPTIONS = ["--d-model", "16", "--num-layers", "2", "--attn-dim", "8", "--num-heads", "2", "--dropout", "0.2"]
OPTIONS += ["--batch-tokens", "60", "--lr", "0.01", "--warmup-steps", "5", "--valid-every", "4", "--log-every", "0"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One CPU thread here and in the children (OMP_NUM_THREADS, below): the runs compared bitwise then run alike,
    and tiny models train several times faster on a busy machine than with threads waiting for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """``(tokenizer, text)``: a character tokenizer of :data:`SENTENCES` and the sentences as a text file."""
    folder = tmp_path_factory.mktemp("lm_audit")
    tok = Tokenizer.train(SENTENCES, folder / "tokenizer.model", 40, "char")
    text = folder / "train.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    return tok.path, text


def argv(corpus, out: Path, *extra: str, epochs: int = MAX_EPOCHS) -> list[str]:
    tok, text = corpus
    args = ["train-lm", "--tokenizer", str(tok), "--train-text", str(text), "--valid-text", str(text)]
    return [*args, "--out-dir", str(out), *OPTIONS, "--max-epochs", str(epochs), *extra]


def state_of(out: Path) -> dict:
    return torch.load(f"{out}.train.pt", map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> tuple[dict, dict]:
    """The final state and best LM of a run never stopped."""
    out = tmp_path_factory.mktemp("lm_reference") / "lm"
    assert main(argv(corpus, out)) == 0
    return state_of(out), load_lm(out)[0].state_dict()


def assert_same_run(out: Path, reference: tuple[dict, dict]) -> None:
    """Bitwise the reference run's weights, optimiser state, generator state, progress and best LM."""
    ref, ref_lm = reference
    got = state_of(out)
    for key, value in ref["model"].items():
        assert torch.equal(got["model"][key], value), (key, float((got["model"][key] - value).abs().max()))
    for i, slot in ref["optimizer"]["state"].items():
        for name, value in slot.items():
            assert torch.equal(got["optimizer"]["state"][i][name], value), (i, name)
    assert got["scheduler"]["last_epoch"] == ref["scheduler"]["last_epoch"]
    assert torch.equal(got["rng"]["cpu"], ref["rng"]["cpu"])  # dropout drew exactly what it drew in the reference
    assert {k: got["progress"][k] for k in ("epoch", "batch", "step", "best")} == {
        k: ref["progress"][k] for k in ("epoch", "batch", "step", "best")
    }
    for key, value in load_lm(out)[0].state_dict().items():
        assert torch.equal(value, ref_lm[key]), key


class Killed(BaseException):
    """Stands for ``kill -9``: nothing in train-lm catches it, nothing is saved."""


# Scenarios: {step: how the run is stopped as that step ends}; the run is resumed until it completes.
# term / int: SIGTERM / Ctrl-C; kill: kill -9 (the state on disk is the last validation's); time: --max-time runs
# out; valterm: SIGTERM during the next validation (after its first batch).
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


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_stopped_and_resumed_run_ends_bitwise_where_an_unstopped_one_does(
    name, corpus, reference, tmp_path, monkeypatch
) -> None:
    # Was: the random generator state (dropout) was not saved and a resumed run reseeded it: weights 0.026-0.15 off.
    actions = dict(SCENARIOS[name])
    clock = {"now": 0.0}
    monkeypatch.setattr(lm_train, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))
    step, nll = NoamLR.step, SRUppLM.sentence_nll
    armed = {"valterm": False}

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
            clock["now"] = 1e9
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
            status = main(argv(corpus, out, "--max-time", "1", *resume))
        except Killed:
            status = "killed"
        progress = state_of(out)["progress"]
        stops.append((status, progress["step"], progress["validate"]))
        # finished as asked (all epochs, or --max-time) marks OUT.train.done; a stop, a kill, a run under way do not
        assert Path(f"{out}.train.done").is_file() == (status == 0), (status, stops)
        resume = ["--resume"]
        if progress["epoch"] == MAX_EPOCHS and not progress["validate"]:
            break
    assert not actions, f"stops not reached: {actions}"
    # Each stop saved the state where it should: at the step (SIGTERM, Ctrl-C, --max-time), at the last periodic
    # validation (kill -9), or with the validation it cut short still to do (SIGTERM during validation).
    expected = {"term": (143, False), "int": (130, False), "kill": ("killed", False), "time": (0, False)}
    expected["valterm"] = (143, True)
    for (step, action), (status, saved_at, validate) in zip(SCENARIOS[name].items(), stops, strict=False):
        assert (status, validate) == expected[action], stops
        assert saved_at == (step // 4 * 4 if action == "kill" else step), stops
    assert len(stops) == len(SCENARIOS[name]) + 1 and stops[-1][0] == 0, stops
    assert_same_run(out, reference)
    done = json.loads(Path(f"{out}.train.done").read_text())
    assert done["steps"] == reference[0]["progress"]["step"] and done["epochs"] == MAX_EPOCHS
    assert done["best_valid_ppl"] == reference[0]["progress"]["best"] and done["state"] == f"{out}.train.pt"


STOP_IN_A_CHILD = """
import os, signal, sys, torch
from srupp_asr.cli import main
from srupp_asr.schedulers import NoamLR

how, argv = sys.argv[1], sys.argv[2:]
step, save = NoamLR.step, torch.save
def step_and_signal(self, *args, **kwargs):
    step(self, *args, **kwargs)
    if self.last_epoch == 6 and how != "kill-9-mid-save":
        os.kill(os.getpid(), {"sigterm": signal.SIGTERM, "ctrl-c": signal.SIGINT}[how])
def half_a_save_then_kill_9(obj, path, *args, **kwargs):  # the second state save (step 8): killed half-way
    if "progress" in obj and obj["progress"]["step"] == 8:
        save(obj, path)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    save(obj, path, *args, **kwargs)
NoamLR.step = step_and_signal
torch.save = half_a_save_then_kill_9
sys.exit(main(argv))
"""


@pytest.mark.parametrize(
    ("how", "status", "line"),
    [
        ("sigterm", 143, "terminated (SIGTERM) after step 6"),
        ("ctrl-c", 130, "interrupted (Ctrl-C) after step 6"),
        ("kill-9-mid-save", -9, None),
    ],
)
def test_a_real_signal_in_a_child_then_resume_matches_the_unstopped_run(
    how, status, line, corpus, reference, tmp_path
) -> None:
    out = tmp_path / "lm"
    state = Path(f"{out}.train.pt")
    args = [sys.executable, "-c", STOP_IN_A_CHILD, how, *argv(corpus, out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == status, proc.stderr[-2000:]
    if line is not None:
        last = proc.stderr.strip().splitlines()[-1]
        assert last == f"srupp-asr train-lm: {line}: saved {state}; resume with --resume", last
        assert state_of(out)["progress"]["step"] == 6
    else:  # the kill left the step-4 state whole, and a half-written hidden temporary file beside it
        assert state_of(out)["progress"]["step"] == 4
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p.suffix == ".pt"]
    assert main(argv(corpus, out, "--resume")) == 0
    assert_same_run(out, reference)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.suffix == ".pt"]  # swept


def test_a_resume_with_other_settings_is_refused_naming_the_state_file(corpus, tmp_path, capsys) -> None:
    # Was: only the LM's shape was compared; another --lr, --batch-tokens, --seed, tokenizer with as many pieces,
    # or text was silently trained on from the saved position (the optimiser's saved lr even overrode --lr).
    out = tmp_path / "lm"
    state = f"{out}.train.pt"
    assert main(argv(corpus, out, epochs=1)) == 0
    tok = corpus[0]
    other_text = tmp_path / "other.txt"
    other_text.write_text("\n".join(SENTENCES[:-1]) + "\n")
    same_chars = "\n".join([*SENTENCES, "ooooo ddddd tttttt"])  # the same characters, other counts: other pieces
    other_tok = Tokenizer.train(same_chars.splitlines(), tmp_path / "other_tok.model", 40, "char")
    assert other_tok.vocab_size == Tokenizer(tok).vocab_size
    hint = "resume with the saved run's options, or start afresh without --resume"
    base = argv(corpus, out, "--resume")
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


def test_a_missing_corrupt_or_foreign_state_file_is_one_line_naming_it(corpus, tmp_path, capsys) -> None:
    out = tmp_path / "lm"
    state = Path(f"{out}.train.pt")
    base = argv(corpus, out, "--resume")
    assert main(base) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"{state}: no training state to resume from (run without --resume first)")
    )
    assert main(argv(corpus, out, epochs=1)) == 0
    good = state.read_bytes()
    saved = state_of(out)
    wrong_shape = dict(saved, model=dict(saved["model"], **{"out.bias": torch.zeros(3)}))
    cases = [
        (b"", "empty file (0 bytes), not a checkpoint"),
        (good[: len(good) // 2], "not a readable PyTorch checkpoint"),
        (torch.zeros(3), "not a train-lm state (no model, optimizer, scheduler, progress, config)"),
        ({"model": {}}, "not a train-lm state (no optimizer, scheduler, progress, config)"),
        (dict(saved, progress={"epoch": "1", "batch": 0, "step": 0, "best": 1.0}), "not a train-lm state (bad epoch)"),
        (wrong_shape, "not a usable train-lm state (Error(s) in loading state_dict for SRUppLM:"),
        (dict(saved, rng={"cpu": torch.zeros(3)}), "not a usable train-lm state"),
        (types.SimpleNamespace(a=1), "torch.load(weights_only=True) refused it"),
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


def test_a_second_train_lm_into_the_same_out_dir_is_refused(corpus, tmp_path, capsys) -> None:
    import fcntl

    out = tmp_path / "lm"
    hint = "give this one its own --out-dir"
    fd = os.open(f"{out}.train.lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"4242\n")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a running train-lm holds it
        assert main(argv(corpus, out)) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"srupp-asr train-lm: error: {out}: another train-lm (pid 4242) is training into it; {hint}"
    finally:
        os.close(fd)
    assert main(argv(corpus, out, epochs=1)) == 0  # released with its process (here: its descriptor)


def test_a_resume_whose_lm_directory_is_gone_writes_one_again(corpus, tmp_path, caplog) -> None:
    # Was: the saved best perplexity stood, so a resumed run wrote no LM unless it beat it (and none if finished).
    import shutil

    out = tmp_path / "lm"
    assert main(argv(corpus, out, epochs=1)) == 0
    shutil.rmtree(out)
    assert main(argv(corpus, out, "--resume", epochs=1)) == 0  # the run is finished: nothing left to train
    assert f"{out} holds no LM any more: the next validation writes one" in caplog.text
    lm, _ = load_lm(out)
    saved = state_of(out)
    assert all(torch.equal(v, saved["model"][k]) for k, v in lm.state_dict().items())
    assert saved["progress"]["step"] == 18 and not saved["progress"]["validate"]


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


def test_validation_perplexity_equals_a_float64_token_by_token_computation() -> None:
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
