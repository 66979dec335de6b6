"""``srupp-asr train-lm`` (:mod:`srupp_asr.lm_train`, :mod:`srupp_asr.lm_lightning`): batches within the token budget,
the LM learns its text, errors are one line, and, like the ASR trainer, against independent references: a run stopped in
any way (SIGTERM or Ctrl-C after a step or during validation, ``--max-time``, ``kill -9`` after or during a save) and
resumed ends with bitwise the weights, optimiser state, random generator states and best LM of a run never stopped;
its state file is written atomically and read safely, and a resume with other settings is refused naming the file.
The validation perplexity equals a float64 step-by-step computation."""

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
from lightning.pytorch.callbacks import timer

from srupp_asr.cli import main
from srupp_asr.lm import SOS_EOS_ID, SRUppLM, load_lm
from srupp_asr.lm_lightning import LMDataModule, LMLightningModule, make_batches
from srupp_asr.lm_train import LMTrainConfig, train_lm
from srupp_asr.schedulers import NoamLR
from srupp_asr.tokenizer import Tokenizer
from tests.test_lm import SENTENCES


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    """A character tokenizer of :data:`SENTENCES`."""
    return Tokenizer.train(SENTENCES, tmp_path_factory.mktemp("lm_tok") / "tokenizer.model", 40, "char")


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

    def test_init_from_starts_from_an_lm_and_takes_its_shape(self, lm_corpus, tmp_path, capsys) -> None:
        # Fine-tuning an LM on new text (the built-in LM on prose): the run starts from its weights.
        tok, text = lm_corpus
        first = tmp_path / "first"
        assert main(argv(lm_corpus, first, epochs=1)) == 0
        start = load_lm(first)[0].state_dict()
        base = ["train-lm", "--tokenizer", str(tok), "--train-text", str(text), "--valid-text", str(text)]
        still = ["--lr", "1e-12", "--warmup-steps", "1", "--dropout", "0.2", "--batch-tokens", "60", "--log-every", "0"]
        # No shape option: --d-model 16, --num-layers 2, --attn-dim 8, --num-heads 2 come from the LM.
        tuned = tmp_path / "tuned"
        assert main([*base, "--out-dir", str(tuned), "--init-from", str(first), *still, "--max-epochs", "1"]) == 0
        after = load_lm(tuned)[0].state_dict()
        assert after.keys() == start.keys()
        assert all(torch.allclose(after[k], start[k], atol=1e-6) for k in start)  # a learning rate of 1e-12: unmoved
        fresh = tmp_path / "fresh"
        assert main([*base, "--out-dir", str(fresh), *OPTIONS[:8], *still, "--max-epochs", "1"]) == 0
        assert not torch.allclose(load_lm(fresh)[0].state_dict()["embed.weight"], start["embed.weight"], atol=1e-3)
        # A resume needs the same starting weights.
        state = f"{tuned}.train.pt"
        resume = [*base, "--out-dir", str(tuned), *OPTIONS[:8], *still, "--max-epochs", "2", "--resume"]
        assert main(resume) == 2
        err = capsys.readouterr().err.strip()
        hint = "resume with the saved run's options, or start afresh without --resume"
        assert (
            err == f"srupp-asr train-lm: error: {state}: saved for a run from --init-from weights (give the same"
            f" --init-from); {hint}"
        ), err
        # Refused in one line: a shape option that differs, another tokenizer, not an LM directory.
        other_chars = [s.replace("i", "y") for s in SENTENCES]  # as many pieces, one of them another letter
        other_tok = Tokenizer.train(other_chars, tmp_path / "other_tok.model", 40, "char")
        assert other_tok.vocab_size == Tokenizer(tok).vocab_size
        out = ["--out-dir", str(tmp_path / "bad")]
        for extra, message in [
            (["--init-from", str(first), "--d-model", "32"], "--init-from's LM has --d-model 16, not 32"),
            (["--init-from", str(tmp_path / "nope")], "nope"),
            (["--init-from", str(first), "--tokenizer", str(other_tok.path)], "differs from the training tokenizer"),
        ]:
            assert main([*base, *out, *still, "--max-epochs", "1", *extra]) == 2, extra
            err = capsys.readouterr().err.strip()
            assert message in err and len(err.splitlines()) == 1, err

    def test_validation_perplexity_equals_a_float64_token_by_token_computation(self, tmp_path) -> None:
        import lightning as L

        torch.manual_seed(0)
        lm = SRUppLM(30, d_model=32, num_layers=3, attn_dim=16, num_heads=2, dropout=0.3, attn_dropout=0.3)
        for layer in lm.body.layers:
            if layer.attention:
                torch.nn.init.constant_(layer.alpha, 0.7)  # attention on
        g = torch.Generator().manual_seed(1)
        lens = torch.randint(1, 15, (25,), generator=g).tolist()
        sentences = [torch.randint(3, 30, (n,), generator=g).tolist() for n in lens]
        expected = float64_perplexity(lm, sentences)
        # train-lm's own validation: the module's steps over the data module's batches, run by a Lightning Trainer
        module = LMLightningModule(lm.config, 0.01, 5, 0.0, str(tmp_path / "lm"), "unused.model")
        module.lm.load_state_dict(lm.state_dict())
        module.train()
        for batch_tokens in (1, 13, 40, 10_000):  # one sentence per batch, padded batches, all in one
            trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
            trainer.validate(module, datamodule=LMDataModule([], sentences, batch_tokens, 0), verbose=False)
            assert float(trainer.callback_metrics["valid/ppl"]) == pytest.approx(expected, rel=1e-6)
        assert module.training  # evaluated in eval mode (no dropout), training mode given back
        assert not (tmp_path / "lm").exists()  # validation outside a fit writes no LM
