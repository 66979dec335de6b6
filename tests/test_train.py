"""Training: the LightningModule's steps (non-finite losses, WER aggregation) and ``srupp-asr train`` end to end."""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import random
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from srupp_asr.errors import UserError
from srupp_asr.frontend import compute_cmvn_stats, save_cmvn
from srupp_asr.lightning_module import ASRLightningModule, rng_states, set_rng_states, word_errors
from srupp_asr.tokenizer import Tokenizer
from srupp_asr.train import TRUSTED_CLASSES_ENV, add_parser, check_trusted_classes, run_train
from tests.helpers import SPOKEN, TINY_CONFIG, FusedAdamMixin, cpu_trainer, write_manifest

NETWORK = {
    "d_model": 16,
    "encoder_conf": {"d_model": 32, "num_layers": 1, "attn_dim": 16},
    "decoder_conf": {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32},
    "specaugment": None,
    "warmup_steps": 10,
}


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("lang") / "tokenizer.model"
    Tokenizer.train([*SPOKEN, "one two three four five six seven"], path, vocab_size=60, model_type="char")
    return str(path)


@pytest.fixture(scope="module")
def speech_corpus(synthesize_speech, tokenizer_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Four espeak-ng utterances as a cut manifest, with the tokenizer and CMVN stats to train on them."""
    folder = tmp_path_factory.mktemp("corpus")
    cuts = []
    for i, text in enumerate(SPOKEN):
        rec = Recording.from_file(synthesize_speech(text, f"utt{i}.wav"), recording_id=f"utt{i}")
        sup = SupervisionSegment(id=f"utt{i}", recording_id=rec.id, start=0.0, duration=rec.duration, text=text)
        cuts.append(
            MonoCut(id=f"utt{i}", start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup])
        )
    cutset = CutSet.from_cuts(cuts)
    cutset.to_file(folder / "cuts.jsonl.gz")
    save_cmvn(folder / "cmvn.json", *compute_cmvn_stats(cutset))
    return {"cuts": str(folder / "cuts.jsonl.gz"), "cmvn": str(folder / "cmvn.json"), "tokenizer": tokenizer_path}


def synthetic_batches(tokenizer: Tokenizer, count: int) -> list[dict]:
    """``count`` batches of two noise 'utterances' (0.5 s and 0.4 s) with real token targets."""
    gen = torch.Generator().manual_seed(0)
    batches = []
    for i in range(count):
        texts = [SPOKEN[i % 4], SPOKEN[(i + 1) % 4][:8]]
        ids = [torch.tensor(tokenizer.encode(t)) for t in texts]
        tokens = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=-1)
        audio = 0.1 * torch.randn(2, 8000, generator=gen)
        audio[1, 6400:] = 0.0
        batches.append(
            {
                "audio": audio,
                "audio_lens": torch.tensor([8000, 6400]),
                "tokens": tokens,
                "token_lens": torch.tensor([len(x) for x in ids]),
                "texts": texts,
                "cut_ids": [f"b{i}u0", f"b{i}u1"],
            }
        )
    return batches


class NaNAudioModule(ASRLightningModule):
    """Feeds NaN audio (so a NaN loss) at the given training-step calls, on one rank or all."""

    def __init__(self, *args, nan_calls: tuple[int, ...] = (), nan_rank: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_calls, self.nan_rank, self.calls = set(nan_calls), nan_rank, 0

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        if self.calls in self.nan_calls and self.nan_rank in (None, self.global_rank):
            batch = {**batch, "audio": batch["audio"] * float("nan")}
        self.calls += 1
        return super().training_step(batch, batch_idx)


class FusedAdamModule(FusedAdamMixin, NaNAudioModule):
    pass


class UpdateRecorder(L.Callback):
    """Records, per training batch, whether any parameter changed; writes them to ``out/rank<N>.json``."""

    def __init__(self, out: Path | None = None) -> None:
        self.out, self.changed, self.skipped = out, [], []

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: dict, idx: int) -> None:
        self._before = [p.detach().clone() for p in module.parameters()]

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, out, batch: dict, idx: int) -> None:
        self.changed.append(any(not torch.equal(a, p) for a, p in zip(self._before, module.parameters(), strict=True)))
        self.skipped.append(module.nonfinite_skipped)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.out is not None:
            params = [float(p.double().sum()) for p in module.parameters()]
            record = {"changed": self.changed, "skipped": self.skipped, "step": trainer.global_step, "params": params}
            (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def test_nonfinite_loss_skips_the_update_and_training_goes_on(tokenizer_path):
    torch.manual_seed(0)
    module = NaNAudioModule(tokenizer_path, nan_calls=(1, 2), max_consecutive_nonfinite=3, **NETWORK)
    recorder = UpdateRecorder()
    trainer = cpu_trainer(5, [recorder])
    loader = torch.utils.data.DataLoader(synthetic_batches(module.tokenizer, 5), batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    assert recorder.changed == [True, False, False, True, True]
    assert recorder.skipped == [0, 1, 2, 2, 2]
    assert module.nonfinite_skipped == 2 and float(trainer.callback_metrics["train/nonfinite_skipped"]) == 2.0
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert trainer.global_step == 5  # skipped batches still count as steps (and advance the LR schedule)


def test_a_batch_left_empty_by_the_data_is_skipped_without_counting_as_nonfinite(tokenizer_path):
    module = ASRLightningModule(tokenizer_path, **NETWORK)
    batches = synthetic_batches(module.tokenizer, 2)
    empty = {"audio": torch.zeros(0, 0), "audio_lens": torch.zeros(0, dtype=torch.long), "texts": [], "cut_ids": []}
    empty.update(tokens=torch.zeros(0, 0, dtype=torch.long), token_lens=torch.zeros(0, dtype=torch.long))
    recorder = UpdateRecorder()
    loader = torch.utils.data.DataLoader([batches[0], empty, batches[1]], batch_size=None)
    cpu_trainer(3, [recorder]).fit(module, train_dataloaders=loader)
    assert recorder.changed == [True, False, True]
    assert module.nonfinite_skipped == 0


def test_cmvn_file_is_loaded_into_the_model_and_checked(tokenizer_path, tmp_path):
    save_cmvn(tmp_path / "cmvn.json", torch.full((80,), 3.0), torch.full((80,), 4.0))
    module = ASRLightningModule(tokenizer_path, cmvn=str(tmp_path / "cmvn.json"), **NETWORK)
    assert torch.equal(module.model.cmvn.mean, torch.full((80,), 3.0))
    assert torch.equal(module.model.cmvn.istd, torch.full((80,), 0.25))
    save_cmvn(tmp_path / "cmvn40.json", torch.zeros(40), torch.ones(40))
    with pytest.raises(UserError, match=r"cmvn40\.json: CMVN stats have 40 dimensions, the model has n_mels=80"):
        ASRLightningModule(tokenizer_path, cmvn=str(tmp_path / "cmvn40.json"), **NETWORK)


def test_training_stops_after_too_many_nonfinite_losses_in_a_row(tokenizer_path):
    module = NaNAudioModule(tokenizer_path, nan_calls=tuple(range(10)), max_consecutive_nonfinite=3, **NETWORK)
    recorder = UpdateRecorder()
    loader = torch.utils.data.DataLoader(synthetic_batches(module.tokenizer, 6), batch_size=None)
    with pytest.raises(RuntimeError, match="not finite for 3 batches in a row"):
        cpu_trainer(6, [recorder]).fit(module, train_dataloaders=loader)
    assert recorder.changed == [False, False]  # the third batch raised before its step ended
    assert module.nonfinite_skipped == 3


@pytest.mark.process  # two training processes (gloo)
@pytest.mark.parametrize("guard", ["host", "device"])
def test_nonfinite_loss_on_one_rank_is_skipped_on_every_rank(tokenizer_path, tmp_path, guard):
    """Two CPU processes (gloo), two micro-batches per update: NaN on rank 1 alone, in the last micro-batch of
    the first update, must skip that whole update on both ranks, which stay identical (the guard on the host, or
    on the device with fused Adam's found_inf, summed over the ranks)."""
    torch.manual_seed(0)
    module_class = FusedAdamModule if guard == "device" else NaNAudioModule
    module = module_class(tokenizer_path, nan_calls=(1,), nan_rank=1, **NETWORK)
    loader = torch.utils.data.DataLoader(synthetic_batches(module.tokenizer, 6), batch_size=None)
    recorder = UpdateRecorder(tmp_path)
    options = {"devices": 2, "strategy": "ddp_spawn", "use_distributed_sampler": False, "accumulate_grad_batches": 2}
    options["log_every_n_steps"] = 1
    cpu_trainer(3, [recorder], **options).fit(module, train_dataloaders=loader)
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert record["changed"] == [False, False, False, True, False, True]
        assert record["step"] == 3
        # On the device the count is read when Lightning logs, after this recorder's hook: a batch late.
        assert record["skipped"] == ([0, 1, 1, 1, 1, 1] if guard == "host" else [0, 0, 1, 1, 1, 1])
    assert records[0]["params"] == records[1]["params"]


class EmptyOnRank1:
    """Rank 1's first batch comes empty (all its cuts failed to load)."""

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        if self.calls == 0 and self.global_rank == 1:
            batch = {**batch, "audio": batch["audio"][:0], "audio_lens": batch["audio_lens"][:0]}
            batch.update(tokens=batch["tokens"][:0], token_lens=batch["token_lens"][:0], texts=[], cut_ids=[])
        return super().training_step(batch, batch_idx)


class EmptyOnRank1Host(EmptyOnRank1, NaNAudioModule):
    pass


class EmptyOnRank1Device(EmptyOnRank1, FusedAdamModule):
    pass


@pytest.mark.process  # two training processes (gloo)
@pytest.mark.parametrize("guard", ["host", "device"])
def test_a_batch_empty_on_one_rank_skips_the_update_on_every_rank(tokenizer_path, tmp_path, guard):
    torch.manual_seed(0)
    module_class = EmptyOnRank1Device if guard == "device" else EmptyOnRank1Host
    module = module_class(tokenizer_path, **NETWORK)
    loader = torch.utils.data.DataLoader(synthetic_batches(module.tokenizer, 4), batch_size=None)
    recorder = UpdateRecorder(tmp_path)
    options = {"devices": 2, "strategy": "ddp_spawn", "use_distributed_sampler": False, "log_every_n_steps": 1}
    cpu_trainer(2, [recorder], **options).fit(module, train_dataloaders=loader)
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert record["changed"] == [False, True] and record["step"] == 2
        assert record["skipped"] == [0, 0]  # not a non-finite loss
    assert records[0]["params"] == records[1]["params"]


def _fused_run(tokenizer_path: str, batches: list[dict], **kwargs) -> tuple[FusedAdamModule, UpdateRecorder]:
    torch.manual_seed(0)
    module = FusedAdamModule(tokenizer_path, **{**NETWORK, **kwargs})
    recorder = UpdateRecorder()
    trainer = cpu_trainer(len(batches), [recorder], log_every_n_steps=1)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    return module, recorder


def test_on_the_device_a_nonfinite_loss_skips_the_update_as_the_host_guard_does(tokenizer_path):
    # Fused Adam's found_inf: the host never reads the flag in the step. The weights must end as the host guard
    # leaves them (which skips backward and the optimizer step), bit for bit, with the same optimizer.
    batches = synthetic_batches(Tokenizer(tokenizer_path), 5)
    module, recorder = _fused_run(tokenizer_path, batches, nan_calls=(1, 2), max_consecutive_nonfinite=3)
    assert module._skips_on_device()
    assert recorder.changed == [True, False, False, True, True]
    assert module.nonfinite_skipped == 2 and module._nonfinite_in_a_row == 0
    assert float(module.trainer.callback_metrics["train/nonfinite_skipped"]) == 2.0
    assert all(torch.isfinite(p).all() for p in module.parameters())

    class OnTheHost(FusedAdamModule):
        def _skips_on_device(self) -> bool:
            return False

    torch.manual_seed(0)
    reference = OnTheHost(tokenizer_path, nan_calls=(1, 2), **NETWORK)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    cpu_trainer(5).fit(reference, train_dataloaders=loader)
    assert reference.nonfinite_skipped == 2
    for p, q in zip(module.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_on_cuda_the_nonfinite_guard_runs_in_fused_adam(tokenizer_path):
    torch.manual_seed(0)
    module = NaNAudioModule(tokenizer_path, nan_calls=(1,), **NETWORK)
    recorder = UpdateRecorder()
    trainer = cpu_trainer(3, [recorder], accelerator="cuda", log_every_n_steps=1)
    loader = torch.utils.data.DataLoader(synthetic_batches(module.tokenizer, 3), batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    assert module._skips_on_device() and recorder.changed == [True, False, True]
    assert module.nonfinite_skipped == 1 and all(torch.isfinite(p).all() for p in module.parameters())


def test_on_the_device_too_many_nonfinite_losses_in_a_row_stop_training(tokenizer_path):
    batches = synthetic_batches(Tokenizer(tokenizer_path), 6)
    with pytest.raises(RuntimeError, match="not finite for 3 batches in a row"):
        _fused_run(tokenizer_path, batches, nan_calls=tuple(range(10)), max_consecutive_nonfinite=3)


def test_on_the_device_a_checkpoint_in_mid_cycle_keeps_the_skip_of_a_nonfinite_micro_batch(tokenizer_path, tmp_path):
    # The first micro-batch of a two-batch update is NaN, and a checkpoint is written after it: the accumulated
    # gradients it holds are NaN, so the resumed run must still skip that update (not apply them).
    batches = synthetic_batches(Tokenizer(tokenizer_path), 4)

    class SaveAfterFirst(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            if idx == 0:
                trainer.save_checkpoint(tmp_path / "mid.ckpt")

    torch.manual_seed(0)
    module = FusedAdamModule(tokenizer_path, nan_calls=(0,), **NETWORK)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    cpu_trainer(1, [SaveAfterFirst()], accumulate_grad_batches=2).fit(module, train_dataloaders=loader)
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=True)
    assert saved["accumulated_found_inf"] == 1.0
    assert any(not torch.isfinite(g).all() for g in saved["accumulated_gradients"][0].values())
    resumed = FusedAdamModule(tokenizer_path, **NETWORK)
    recorder = UpdateRecorder()
    trainer = cpu_trainer(1, [recorder], accumulate_grad_batches=2)
    trainer.fit(resumed, train_dataloaders=loader, ckpt_path=tmp_path / "mid.ckpt")
    assert trainer.global_step == 1 and recorder.changed == [False]
    assert all(torch.isfinite(p).all() for p in resumed.parameters())
    assert resumed.nonfinite_skipped == 1


def test_utterances_ctc_cannot_emit_are_counted_per_epoch_and_warned_about_once(tokenizer_path, caplog):
    # Was: zero_infinity dropped them from the CTC loss without a word: a too-coarse subsampling for the vocabulary
    # went unnoticed.
    module = ASRLightningModule(tokenizer_path, **NETWORK)
    batches = synthetic_batches(module.tokenizer, 4)
    expected = 0  # the reference: utterances whose CTC loss is infinite without zero_infinity, on any log-probs
    with torch.no_grad():
        for batch in batches:
            _, enc_lens = module.model.encode(batch["audio"], batch["audio_lens"])
            for frames, tokens, n in zip(enc_lens, batch["tokens"], batch["token_lens"], strict=True):
                log_probs = torch.randn(int(frames), 1, module.tokenizer.vocab_size).log_softmax(-1)
                loss = torch.nn.functional.ctc_loss(log_probs, tokens[None, :n], frames[None], n[None])
                expected += int(torch.isinf(loss))
    assert 0 < expected < 8
    trainer = cpu_trainer(4, [])
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    assert float(trainer.callback_metrics["train/ctc_unreachable"]) == expected
    warnings = [r.getMessage() for r in caplog.records if "CTC can emit" in r.getMessage()]
    assert len(warnings) == 1 and "(subsampling x4)" in warnings[0]


def test_valid_wer_is_total_errors_over_total_words(tokenizer_path):
    module = ASRLightningModule(tokenizer_path, **NETWORK)
    tok = module.tokenizer
    refs = [["One, two three FOUR!"], ["six seven"]]
    hyps = [["one two three five"], [""]]  # 1 error in 4 words, then 2 in 2: 3 / 6, not the mean 62.5 %
    batches = synthetic_batches(tok, 2)
    for batch, texts in zip(batches, refs, strict=True):
        ids = [torch.tensor(tok.encode(t)) for t in texts]
        batch.update(
            audio=batch["audio"][:1],
            audio_lens=batch["audio_lens"][:1],
            tokens=torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=-1),
            token_lens=torch.tensor([len(x) for x in ids]),
            texts=texts,
            cut_ids=batch["cut_ids"][:1],
        )
    pending = [[tok.encode(h) for h in batch_hyps] for batch_hyps in hyps]
    module.model.ctc_greedy_encoded = lambda enc, enc_lens: pending.pop(0)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    trainer = cpu_trainer(1, [], limit_val_batches=None)
    (metrics,) = trainer.validate(module, dataloaders=loader, verbose=False)
    assert metrics["valid/wer"] == pytest.approx(50.0)
    assert {"valid/loss", "valid/loss_ctc", "valid/loss_att", "valid/acc"} <= set(metrics)
    assert pending == []


def test_valid_wer_leaves_out_the_copies_lhotse_pads_the_last_ddp_round_with(tokenizer_path):
    # Was: under DDP, when the last round of validation holds fewer cuts than ranks, lhotse gives the short ranks
    # copies of cuts (ids ending "_dup<N>"), and their word errors counted again in valid/wer.
    module = ASRLightningModule(tokenizer_path, **NETWORK)
    tok = module.tokenizer
    batch = synthetic_batches(tok, 2)
    texts, hyps = ["six seven", "six", "six"], ["six seven", "seven", "seven"]
    ids = [torch.tensor(tok.encode(t)) for t in texts]
    batch = {
        "audio": torch.cat([batch[0]["audio"], batch[1]["audio"][:1]]),
        "audio_lens": torch.tensor([8000, 6400, 8000]),
        "tokens": torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=-1),
        "token_lens": torch.tensor([len(x) for x in ids]),
        "texts": texts,
        "cut_ids": ["a", "b", "b_dup0"],
    }
    module.model.ctc_greedy_encoded = lambda enc, enc_lens: [tok.encode(h) for h in hyps]
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    (metrics,) = cpu_trainer(1, [], limit_val_batches=None).validate(module, dataloaders=loader, verbose=False)
    assert metrics["valid/wer"] == pytest.approx(100 / 3)  # 1 error in 3 words; with the copy it was 2 in 4


def test_word_errors_compare_normalised_texts():
    assert word_errors("The cat, sat!", "the cat sat") == (0, 3)
    assert word_errors("a b c", "a c d") == (2, 3)  # two edits either way: b->c, c->d or -b, +d
    assert word_errors("a b", "") == (2, 2)
    assert word_errors("", "x y") == (2, 0)


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_train_fit_writes_last_checkpoint_and_resumes_from_it(speech_corpus, tmp_path):
    root = tmp_path / "exp"
    common = [
        "fit",
        "--config",
        str(TINY_CONFIG),
        f"--data.train_cuts={speech_corpus['cuts']}",
        f"--data.valid_cuts={speech_corpus['cuts']}",
        f"--data.tokenizer={speech_corpus['tokenizer']}",
        f"--model.cmvn={speech_corpus['cmvn']}",
        f"--trainer.default_root_dir={root}",
        "--trainer.limit_val_batches=1",
        "--data.max_duration=3",
    ]
    run_train([*common, "--trainer.max_steps=3"])
    last = root / "checkpoints" / "last.ckpt"
    first = torch.load(last, map_location="cpu", weights_only=True)
    assert first["global_step"] == 3
    assert first["hyper_parameters"]["tokenizer"] == speech_corpus["tokenizer"]  # linked from data.tokenizer
    config = yaml.safe_load((root / "csv" / "version_0" / "config.yaml").read_text())
    assert config["data"]["tokenizer"] == speech_corpus["tokenizer"]
    assert "tokenizer" not in config["model"]  # a link target is derived, so the saved config leaves it out
    rows = read_metrics(root / "csv" / "version_0")
    # Noam warm-up: peak 0.002 (conf/tiny_cpu.yaml) times step / 50 for steps 1, 2, 3.
    lrs = [float(r["train/lr"]) for r in rows if r["train/lr"]]
    assert lrs == pytest.approx([0.002 * s / 50 for s in (1, 2, 3)])
    wer = [float(r["valid/wer"]) for r in rows if r["valid/wer"]]
    assert len(wer) == 1 and wer[0] >= 0

    run_train([*common, "--trainer.max_steps=5", "--ckpt_path=last"])
    resumed = torch.load(last, map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 5
    # The schedule goes on from step 3: the resumed run's learning rates are those of steps 4 and 5.
    lrs = [float(r["train/lr"]) for r in read_metrics(root / "csv" / "version_1") if r["train/lr"]]
    assert lrs == pytest.approx([0.002 * s / 50 for s in (4, 5)])
    assert not torch.equal(
        first["state_dict"]["model.ctc.weight"], resumed["state_dict"]["model.ctc.weight"]
    )  # it trained further


def test_config_problems_are_user_errors_naming_the_file(tmp_path, tokenizer_path):
    with pytest.raises(UserError, match=r"^nothere\.yaml: config file not found, and no shipped config of that name"):
        run_train(["fit", "--config", "nothere.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  lr: [0.1\n")
    with pytest.raises(UserError, match=rf"^{bad}: not valid YAML at line 3"):
        run_train(["fit", "--config", str(bad)])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("model:\n  not_an_option: 1\n")
    with pytest.raises(UserError, match=rf"^{unknown}: .*model\.not_an_option"):
        run_train(["fit", "--config", str(unknown), "--data.tokenizer", tokenizer_path])
    with pytest.raises(UserError, match=r"^command line: .*model\.optimizer"):
        run_train(["fit", "--config", str(TINY_CONFIG), "--model.optimizer", "sgd"])
    with pytest.raises(UserError, match=r"missing\.model: tokenizer model not found"):
        run_train(["fit", "--config", str(TINY_CONFIG), "--data.tokenizer", "missing.model"])


def test_train_subcommand_hands_every_word_to_lightning():
    parser = argparse.ArgumentParser(prog="srupp-asr")
    add_parser(parser.add_subparsers(dest="command"))
    words = ["fit", "--config", "conf/tiny_cpu.yaml", "--trainer.max_steps", "3", "--help"]
    args = parser.parse_args(["train", *words])
    assert args.lightning_args == words and args.func.__name__ == "train_command"


@pytest.mark.parametrize("name", ["train_srupp", "train_conformer", "train_blstm", "tiny_cpu"])
def test_shipped_configs_parse(name, tokenizer_path, capsys):
    config = Path(TINY_CONFIG).with_name(f"{name}.yaml")
    with pytest.raises(SystemExit) as exit_info:
        run_train(["fit", "--config", str(config), "--data.tokenizer", tokenizer_path, "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["encoder"] == ("srupp" if name in ("train_srupp", "tiny_cpu") else name.split("_")[1])
    assert printed["trainer"]["use_distributed_sampler"] is False
    assert printed["checkpoint"]["save_last"] is True


class FirstBatchWeights(L.Callback):
    """The module's weights as they stand when the first training batch starts."""

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: dict, idx: int) -> None:
        if not hasattr(self, "weights"):
            self.weights = {k: v.detach().clone() for k, v in module.model.state_dict().items()}


def _fit_one_step(module: ASRLightningModule, max_steps: int = 1, **fit_kwargs) -> dict[str, torch.Tensor]:
    """Weights at the start of the first training batch of a fit of ``module`` (one batch per epoch)."""
    seen = FirstBatchWeights()
    loader = torch.utils.data.DataLoader(synthetic_batches(module.tokenizer, 1), batch_size=None)
    cpu_trainer(max_steps, [seen]).fit(module, train_dataloaders=loader, **fit_kwargs)
    return seen.weights


def test_init_from_a_model_directory_starts_the_fit_from_its_weights(tokenizer_path, tmp_path):
    from srupp_asr.model_dir import export_model

    torch.manual_seed(1)
    trained = ASRLightningModule(tokenizer_path, **NETWORK)
    trained.model.set_cmvn(torch.full((80,), 2.0), torch.full((80,), 3.0))
    with torch.no_grad():
        for p in trained.model.parameters():
            p.add_(0.5)  # far from any fresh initialisation
    model_dir = export_model(
        trained.model.state_dict(), trained.model.config, tokenizer_path, tmp_path / "model", dtype=torch.float16
    )
    save_cmvn(tmp_path / "other_cmvn.json", torch.zeros(80), torch.ones(80))
    torch.manual_seed(2)
    module = ASRLightningModule(
        tokenizer_path, cmvn=str(tmp_path / "other_cmvn.json"), init_from=str(model_dir), **NETWORK
    )
    assert torch.equal(module.model.cmvn.mean, torch.zeros(80))  # nothing is loaded before the fit
    start = _fit_one_step(module)
    for key, value in trained.model.state_dict().items():
        expected = value if key.startswith("cmvn.") else value.to(torch.float16).float()  # stored in float16
        assert torch.equal(start[key], expected), key
    # its CMVN stats came with the weights, replacing model.cmvn's
    assert torch.equal(start["cmvn.mean"], torch.full((80,), 2.0))
    assert not torch.equal(module.model.ctc.weight, start["ctc.weight"])  # and the fit went on from there


def test_init_from_a_checkpoint_and_a_resume_takes_precedence(tokenizer_path, tmp_path):
    torch.manual_seed(3)
    source = ASRLightningModule(tokenizer_path, **NETWORK)
    loader = torch.utils.data.DataLoader(synthetic_batches(source.tokenizer, 2), batch_size=None)
    trainer = cpu_trainer(2, [])
    trainer.fit(source, train_dataloaders=loader)
    trainer.save_checkpoint(tmp_path / "source.ckpt")
    module = ASRLightningModule(tokenizer_path, init_from=str(tmp_path / "source.ckpt"), **NETWORK)
    start = _fit_one_step(module)
    assert all(torch.equal(start[k], v) for k, v in source.model.state_dict().items())

    torch.manual_seed(4)
    other = ASRLightningModule(tokenizer_path, **NETWORK)
    trainer = cpu_trainer(1, [])
    trainer.fit(
        other, train_dataloaders=torch.utils.data.DataLoader(synthetic_batches(other.tokenizer, 1), batch_size=None)
    )
    trainer.save_checkpoint(tmp_path / "resume.ckpt")
    module = ASRLightningModule(tokenizer_path, init_from=str(tmp_path / "source.ckpt"), **NETWORK)
    assert not torch.equal(other.model.ctc.weight, source.model.ctc.weight)
    # resume.ckpt is at step 1: one more step, which starts from its weights, not init_from's
    start = _fit_one_step(module, max_steps=2, ckpt_path=str(tmp_path / "resume.ckpt"))
    assert all(torch.equal(start[k], v) for k, v in other.model.state_dict().items())


def test_init_from_problems_are_one_line_errors_naming_the_source(tokenizer_path, tmp_path):
    from srupp_asr.model_dir import export_model

    small = ASRLightningModule(tokenizer_path, **NETWORK)
    model_dir = export_model(small.model.state_dict(), small.model.config, tokenizer_path, tmp_path / "model")
    deeper = {**NETWORK, "encoder_conf": {**NETWORK["encoder_conf"], "num_layers": 2}}
    cases = [
        (tmp_path / "absent", NETWORK, tokenizer_path, "not found"),
        (model_dir, deeper, tokenizer_path, r"does not fit the model being trained \(missing weights encoder"),
    ]
    # The same characters in other proportions: as many pieces (so every shape fits), in another order.
    other_tokenizer = tmp_path / "other.model"
    text = [*SPOKEN, "one two three four five six seven", "gggggggg vvvvvvvv"]
    Tokenizer.train(text, other_tokenizer, vocab_size=60, model_type="char")
    other, ours = Tokenizer(other_tokenizer), Tokenizer(tokenizer_path)
    assert other.vocab_size == ours.vocab_size and other.pieces() != ours.pieces()
    cases.append((model_dir, NETWORK, str(other_tokenizer), "differs from the training tokenizer"))
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    cases.append((junk, NETWORK, tokenizer_path, "not a readable PyTorch checkpoint"))
    for source, network, tokenizer, message in cases:
        module = ASRLightningModule(tokenizer, init_from=str(source), **network)
        with pytest.raises(UserError, match=rf"^{source}: .*{message}") as err:
            module.setup("fit")
        assert "\n" not in str(err.value)
        module.setup("validate")  # only a fit starts from init_from


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--model.encoder_conf.num_heads", "0"], "model.encoder_conf.num_heads must be at least 1, got 0"),
        (["--model.encoder_conf.num_heads", "3"], r"model.encoder_conf.num_heads must divide attn_dim \(64\), got 3"),
        (["--model.encoder_conf.num_layers", "0"], "model.encoder_conf.num_layers must be at least 1, got 0"),
        (["--model.encoder_conf.num_layers", "-2"], "model.encoder_conf.num_layers must be at least 1, got -2"),
        (["--model.encoder_conf.dropout", "1.5"], "model.encoder_conf.dropout must be a finite number >= 0 and < 1"),
        (["--model.encoder", "lstm"], r"model.encoder must be one of \[srupp, conformer, blstm\], got 'lstm'"),
        (["--model.subsampling", "5"], r"model.subsampling must be one of \[4, 6, 8\], got 5"),
        (["--model.ctc_weight", "1.5"], "model.ctc_weight must be a finite number >= 0 and <= 1, got 1.5"),
        (["--model.n_mels", "0"], "model.n_mels must be at least 1, got 0"),
        (["--model.lr", "-1"], "model.lr must be a finite number > 0, got -1.0"),
        (["--model.warmup_steps", "0"], "model.warmup_steps must be at least 1, got 0"),
        (["--data.max_duration", "-1"], "data.max_duration must be a finite number > 0, got -1.0"),
        (["--data.num_buckets", "0"], "data.num_buckets must be at least 1, got 0"),
        (["--data.num_workers", "-1"], "data.num_workers must be non-negative, got -1"),
        (["--trainer.max_steps", "-5"], "trainer.max_steps is refused: `max_steps` must be a non-negative integer"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_option(override, message, tokenizer_path, tmp_path):
    argv = ["fit", "--config", str(TINY_CONFIG), "--data.tokenizer", tokenizer_path]
    with pytest.raises(UserError, match=rf"^command line: {message}") as err:
        run_train([*argv, "--trainer.default_root_dir", str(tmp_path), *override])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model:\n  encoder_conf:\n    num_heads: 0\n", r"model\.encoder_conf\.num_heads must be at least 1, got 0"),
        ("model:\n  encoder_conf:\n    d_model: 1e30\n", r"model\.encoder_conf\.d_model must be an integer, got"),
        ("model:\n  lr: .nan\n", r"model\.lr must be a finite number > 0, got nan"),
    ],
)
def test_a_bad_value_in_a_config_file_names_that_file(text, message, tokenizer_path, tmp_path):
    override = tmp_path / "override.yaml"
    override.write_text(text)
    argv = ["fit", "--config", str(TINY_CONFIG), "--config", str(override), "--data.tokenizer", tokenizer_path]
    with pytest.raises(UserError, match=rf"^{override}: {message}"):
        run_train([*argv, "--trainer.default_root_dir", str(tmp_path)])


def test_an_unusable_ckpt_path_or_output_folder_is_a_one_line_error(tokenizer_path, tmp_path):
    argv = ["fit", "--config", str(TINY_CONFIG), "--data.tokenizer", tokenizer_path]
    garbage, a_file = tmp_path / "garbage.bin", tmp_path / "a_file"
    garbage.write_bytes(b"\x1f\x8b not a checkpoint")
    a_file.write_text("")
    cases = [
        (
            ["--ckpt_path", str(tmp_path / "missing.ckpt")],
            rf"ckpt_path: {tmp_path}/missing\.ckpt: checkpoint not found",
        ),
        (["--ckpt_path", str(garbage)], rf"ckpt_path: {garbage}: not a readable PyTorch checkpoint"),
        (
            ["--trainer.default_root_dir", str(a_file)],
            rf"command line: trainer\.default_root_dir cannot be created: {a_file}: exists and is not a folder",
        ),
    ]
    for override, message in cases:
        with pytest.raises(UserError, match=f"^{message}") as err:
            run_train([*argv, "--trainer.default_root_dir", str(tmp_path / "run"), *override])
        assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_training_acceptance.py


def test_random_states_survive_a_weights_only_checkpoint_round_trip() -> None:
    """The states a checkpoint stores load with weights_only=True and replay torch, numpy and Python draws."""

    def draws() -> tuple[list[float], list[float], list[float]]:
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    np.random.randn()  # leaves a cached Gaussian in numpy's state, which must survive too
    buffer = io.BytesIO()
    torch.save({"rng_states": rng_states()}, buffer)
    expected = draws()
    buffer.seek(0)
    set_rng_states(torch.load(buffer, weights_only=True)["rng_states"])
    assert draws() == expected


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_reliability_inputs.py: a bad manifest stops training before its first step; configs name
# the file and key of a problem and cannot name classes outside lightning / torch / srupp_asr


def test_training_stops_at_a_bad_manifest_before_the_first_step(speech_corpus, tmp_path):
    with gzip.open(speech_corpus["cuts"], "rt") as f:
        good = [json.loads(line) for line in f]
    bad = write_manifest(tmp_path / "bad.jsonl.gz", [*good[:2], {**good[2], "duration": -1}, *good[3:]])
    root = tmp_path / "exp"
    args = [
        "fit",
        "--config",
        str(TINY_CONFIG),
        f"--data.train_cuts={bad}",
        f"--data.valid_cuts={speech_corpus['cuts']}",
    ]
    args += [f"--data.tokenizer={speech_corpus['tokenizer']}", f"--trainer.default_root_dir={root}"]
    with pytest.raises(UserError, match=rf"^{bad}:3: cut utt2: 'duration' must be a positive number, not -1"):
        run_train([*args, "--trainer.max_steps=2"])
    assert not list(root.rglob("*.ckpt"))
    outside = Path(speech_corpus["cuts"]).parent / "elsewhere"
    with pytest.raises(UserError, match=r"is outside the corpus directories"):
        run_train(
            [*args[:4], f"--data.train_cuts={speech_corpus['cuts']}", *args[5:], f"--data.audio_roots=[{outside}]"]
        )


def test_a_wrong_type_in_a_config_names_the_file_and_key(tmp_path, tokenizer_path):
    config = tmp_path / "lr.yaml"
    config.write_text("model:\n  lr: fast\n")
    with pytest.raises(UserError, match=rf"^{config}: .*model\.lr"):
        run_train(["fit", "--config", str(TINY_CONFIG), "--config", str(config), "--data.tokenizer", tokenizer_path])


def test_a_config_naming_an_untrusted_class_is_refused_before_import(tmp_path, tokenizer_path):
    config = tmp_path / "evil.yaml"
    marker = tmp_path / "imported"
    (tmp_path / "evil_plugin.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config.write_text("trainer:\n  callbacks:\n  - class_path: evil_plugin.Callback\n    init_args: {}\n")
    os.sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(
            UserError, match=rf"^{config}: trainer\.callbacks\[0\]: class 'evil_plugin\.Callback' is not allowed"
        ):
            run_train(
                ["fit", "--config", str(TINY_CONFIG), "--config", str(config), "--data.tokenizer", tokenizer_path]
            )
    finally:
        os.sys.path.remove(str(tmp_path))
    assert not marker.exists()  # refused from the YAML, before jsonargparse imported anything


def test_a_class_from_the_command_line_is_checked_too(tokenizer_path, tmp_path, monkeypatch):
    args = ["fit", "--config", str(TINY_CONFIG), "--data.tokenizer", tokenizer_path, "--trainer.max_steps=0"]
    args += [f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=tests.test_train.UpdateRecorder"]
    monkeypatch.delenv(TRUSTED_CLASSES_ENV, raising=False)
    with pytest.raises(
        UserError,
        match=r"^config: fit\.trainer\.callbacks\[0\]: class 'tests\.test_train\.UpdateRecorder' is not allowed",
    ):
        run_train(args)


def test_trusted_modules_and_the_environment_extension(monkeypatch):
    monkeypatch.delenv(TRUSTED_CLASSES_ENV, raising=False)
    fine = {
        "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger"}},
        "x": [{"class_path": "CSVLogger"}],
    }
    check_trusted_classes(fine, "c.yaml")
    with pytest.raises(UserError, match=r"^c\.yaml: a\.b\[1\]: class 'lightningx\.Evil' is not allowed"):
        check_trusted_classes({"a": {"b": [{}, {"class_path": "lightningx.Evil"}]}}, "c.yaml")
    monkeypatch.setenv(TRUSTED_CLASSES_ENV, "mine, other.pkg")
    check_trusted_classes({"a": {"class_path": "other.pkg.Thing"}, "b": {"class_path": "mine.X"}}, "c.yaml")


def test_the_lightning_classes_are_importable_by_name_and_importing_train_needs_no_lightning():
    import subprocess
    import sys

    code = (
        "import pickle, sys; import srupp_asr.train as t; assert 'lightning' not in sys.modules; "
        "from srupp_asr.train import ASRLightningCLI, StopCheckpoint; "
        "from lightning.pytorch import Callback; from lightning.pytorch.cli import LightningCLI; "
        "assert issubclass(StopCheckpoint, Callback) and issubclass(ASRLightningCLI, LightningCLI); "
        "assert pickle.loads(pickle.dumps(StopCheckpoint)) is StopCheckpoint is t.stop_checkpoint_class(); "
        "print(StopCheckpoint.__module__, StopCheckpoint.__qualname__, ASRLightningCLI.__qualname__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["srupp_asr.train", "StopCheckpoint", "ASRLightningCLI"]
