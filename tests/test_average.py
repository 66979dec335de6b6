"""Checkpoint selection and averaging, model directories (export, pickle-free loading) and ``srupp-asr average``;
the last section checks them against independent references: a float64 mean of the checkpoints read with plain
``torch.load(weights_only=True)``, ``safetensors.torch.load_file``, and the LightningModule the checkpoints come
from."""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from srupp_asr.average import average_checkpoints, model_config_from_checkpoint, parse_size, select, select_checkpoints
from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.frontend import load_cmvn
from srupp_asr.lightning_module import ASRLightningModule
from srupp_asr.model import ASRModel
from srupp_asr.model_dir import export_model, load_model_dir, read_weight_shapes, read_weights
from srupp_asr.tokenizer import Tokenizer
from srupp_asr.train import run_train
from tests.helpers import CHAR_CORPUS, SPOKEN, TINY, TINY_CONFIG, one_line_error, seeded_model, write_checkpoint

EPOCHS = 4
TOP_K = 3
TINY_CONFORMER = {
    **TINY,
    "encoder": "conformer",
    "encoder_conf": {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32, "depthwise_conv_kernel_size": 3},
}


@pytest.fixture(scope="module")
def run(synthesize_speech, char_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``train fit`` of the tiny config: four epochs over four espeak-ng utterances, validating after each
    and keeping the 3 best checkpoints by valid/loss plus last.ckpt. Returns its default_root_dir."""
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    from srupp_asr.frontend import compute_cmvn_stats, save_cmvn

    folder = tmp_path_factory.mktemp("run")
    cuts = []
    for i, text in enumerate(SPOKEN):
        rec = Recording.from_file(synthesize_speech(text, f"utt{i}.wav"), recording_id=f"utt{i}")
        sup = SupervisionSegment(id=f"utt{i}", recording_id=rec.id, start=0.0, duration=rec.duration, text=text)
        cuts.append(MonoCut(f"utt{i}", 0.0, rec.duration, 0, recording=rec, supervisions=[sup]))
    CutSet.from_cuts(cuts).to_file(folder / "cuts.jsonl.gz")
    save_cmvn(folder / "cmvn.json", *compute_cmvn_stats(CutSet.from_cuts(cuts)))
    root = folder / "exp"
    threads = torch.get_num_threads()
    # One thread: on a small shared machine, OpenMP threads fighting other processes make this run 10x slower.
    torch.set_num_threads(1)
    try:
        run_train(
            [
                "fit",
                "--config",
                str(TINY_CONFIG),
                f"--data.train_cuts={folder / 'cuts.jsonl.gz'}",
                f"--data.valid_cuts={folder / 'cuts.jsonl.gz'}",
                f"--data.tokenizer={char_tokenizer.path}",
                f"--model.cmvn={folder / 'cmvn.json'}",
                f"--trainer.default_root_dir={root}",
                f"--trainer.max_epochs={EPOCHS}",
                f"--checkpoint.save_top_k={TOP_K}",
                "--data.max_duration=3",
                "--data.shuffle=false",
                "--trainer.limit_val_batches=1",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    return root


def logged_valid_losses(root: Path) -> dict[int, float]:
    """valid/loss per epoch, as the CSV logger wrote it (independent of the checkpoints)."""
    with open(root / "csv" / "version_0" / "metrics.csv") as f:
        return {int(r["epoch"]): float(r["valid/loss"]) for r in csv.DictReader(f) if r["valid/loss"]}


def raw(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_selection_picks_the_n_best_checkpoints_by_the_logged_validation_loss(run, caplog):
    losses = logged_valid_losses(run)
    assert sorted(losses) == list(range(EPOCHS))
    by_loss = sorted(losses, key=losses.get)
    folder = run / "checkpoints"

    best2 = select(folder, 2)
    assert (best2.metric, best2.mode) == ("valid/loss", "min")  # read from the run's ModelCheckpoint state
    assert [raw(c.path)["epoch"] for c in best2.checkpoints] == by_loss[:2]
    assert [c.score for c in best2.checkpoints] == pytest.approx([losses[e] for e in by_loss[:2]], rel=1e-6)
    assert select_checkpoints(folder, 2) == [c.path for c in best2.checkpoints]

    with caplog.at_level("WARNING"):
        every = select_checkpoints(folder, 10)
    assert [raw(p)["epoch"] for p in every] == by_loss[:TOP_K]  # only the top-k files are left on disk
    assert "asked for the 10 best checkpoints, only 3 have a valid/loss score" in caplog.text
    assert all(p.name != "last.ckpt" for p in every)

    with_last = select_checkpoints(folder, 2, include_last=True)
    last_epoch = raw(folder / "last.ckpt")["epoch"]
    assert last_epoch == EPOCHS - 1
    extra = [] if last_epoch in by_loss[:2] else [folder / "last.ckpt"]
    assert with_last == [c.path for c in best2.checkpoints] + extra

    with pytest.raises(
        UserError, match=r"checkpoints: no checkpoint scored by valid/wer \(monitored metrics: valid/loss\)"
    ):
        select_checkpoints(folder, 2, metric="valid/wer")


def test_real_checkpoints_load_with_weights_only(run):
    for path in (run / "checkpoints").glob("*.ckpt"):
        ckpt = raw(path)
        assert ckpt["global_step"] > 0 and "model.ctc.weight" in ckpt["state_dict"]


def test_average_is_the_mean_of_the_selected_weights(run):
    paths = select_checkpoints(run / "checkpoints", 3)
    assert len(paths) == 3
    weights = [raw(p)["state_dict"] for p in paths]
    avg = average_checkpoints(paths)
    assert list(avg) == list(weights[0])
    for key, value in avg.items():
        assert value.dtype == weights[0][key].dtype
        expected = torch.stack([w[key].double() for w in weights]).mean(0)
        torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-9)
    for w in weights:  # a real average, not one of the checkpoints
        assert not torch.equal(avg["model.ctc.weight"], w["model.ctc.weight"])
    cmvn_path = raw(paths[0])["hyper_parameters"]["cmvn"]
    mean, _ = load_cmvn(cmvn_path)
    assert torch.equal(avg["model.cmvn.mean"], mean) and torch.equal(
        avg["model.cmvn.mean"], weights[0]["model.cmvn.mean"]
    )


def test_selection_follows_the_recorded_mode_and_scores(tmp_path, char_tokenizer, caplog):
    model = seeded_model(0, char_tokenizer.vocab_size)
    accs = {"a.ckpt": 0.5, "b.ckpt": 0.9, "c.ckpt": 0.7}
    best_k: dict[str, float] = {}
    for step, (name, acc) in enumerate(accs.items(), start=1):
        best_k[name] = acc
        write_checkpoint(tmp_path / name, model, step, dict(best_k), monitor="valid/acc", mode="max")
    write_checkpoint(tmp_path / "last.ckpt", model, 3, dict(best_k), monitor="valid/acc", mode="max", last=True)
    # A periodic checkpoint that names itself nowhere: it has no score, whatever its name says.
    write_checkpoint(tmp_path / "epoch=9-valid_acc=0.99.ckpt", model, 4, dict(best_k), monitor="valid/acc", mode="max")

    best = select(tmp_path, 2)
    assert (best.metric, best.mode) == ("valid/acc", "max")
    assert [c.path.name for c in best.checkpoints] == ["b.ckpt", "c.ckpt"]
    assert [c.score for c in best.checkpoints] == pytest.approx([0.9, 0.7])
    with caplog.at_level("WARNING"):
        assert [p.name for p in select_checkpoints(tmp_path, 1, mode="min")] == ["a.ckpt"]
    assert "training kept checkpoints by max" in caplog.text
    assert [p.name for p in select_checkpoints(tmp_path, 1, include_last=True)] == ["b.ckpt", "last.ckpt"]

    listed = [tmp_path / "c.ckpt", tmp_path / "a.ckpt"]
    assert select_checkpoints(listed, num=5) == listed  # a list is averaged whole, in its order
    assert select_checkpoints(listed, num=1) == [tmp_path / "c.ckpt"]
    with pytest.raises(UserError, match=r"epoch=9-valid_acc=0\.99\.ckpt: records no valid/acc score of its own"):
        select_checkpoints([tmp_path / "a.ckpt", tmp_path / "epoch=9-valid_acc=0.99.ckpt"], num=1)
    with pytest.raises(UserError, match=r"nothere\.ckpt: checkpoint not found"):
        select_checkpoints([tmp_path / "nothere.ckpt"])


def test_several_monitored_metrics_need_a_choice(tmp_path, char_tokenizer):
    model = seeded_model(0, char_tokenizer.vocab_size)
    write_checkpoint(tmp_path / "a.ckpt", model, 1, {"a.ckpt": 1.0}, monitor="valid/loss")
    write_checkpoint(tmp_path / "b.ckpt", model, 2, {"b.ckpt": 20.0}, monitor="valid/wer")
    with pytest.raises(UserError, match=r"monitor several metrics \(valid/loss, valid/wer\); pick one"):
        select_checkpoints(tmp_path, 2)
    assert [p.name for p in select_checkpoints(tmp_path, 2, metric="valid/wer")] == ["b.ckpt"]


def test_integer_buffers_come_from_the_latest_checkpoint_and_cmvn_must_agree(tmp_path, char_tokenizer):
    models = [seeded_model(seed, char_tokenizer.vocab_size, **TINY_CONFORMER) for seed in range(3)]
    counters = [k for k, v in models[0].state_dict().items() if not v.is_floating_point()]
    assert counters and all(k.endswith("num_batches_tracked") for k in counters)
    for model, count in zip(models, (7, 30, 12), strict=True):
        for name, buffer in model.named_buffers():
            if name.endswith("num_batches_tracked"):
                buffer.fill_(count)
    # The latest step (30) is not last in the list.
    paths = [
        write_checkpoint(tmp_path / f"{s}.ckpt", m, s, {f"{s}.ckpt": 1.0})
        for m, s in zip(models, (7, 30, 12), strict=True)
    ]
    avg = average_checkpoints(paths)
    assert all(avg[f"model.{k}"].item() == 30 and avg[f"model.{k}"].dtype == torch.int64 for k in counters)
    states = [m.state_dict() for m in models]
    running = next(k for k in states[0] if k.endswith("running_mean"))
    torch.testing.assert_close(avg[f"model.{running}"], sum(s[running] for s in states) / 3)
    assert torch.equal(avg["model.cmvn.istd"], torch.full((80,), 0.5))

    models[2].set_cmvn(torch.zeros(80), torch.ones(80))
    write_checkpoint(tmp_path / "12.ckpt", models[2], 12, {"12.ckpt": 1.0})
    with pytest.raises(UserError, match=r"12\.ckpt: its CMVN stats \(model\.cmvn\.mean\) differ from 7\.ckpt's"):
        average_checkpoints(paths)
    # Same weight shapes, another network: attention split into 4 heads instead of 2.
    other_conf = {**TINY_CONFORMER["encoder_conf"], "num_heads": 4}
    other = seeded_model(0, char_tokenizer.vocab_size, **{**TINY_CONFORMER, "encoder_conf": other_conf})
    write_checkpoint(tmp_path / "other.ckpt", other, 40, {"other.ckpt": 1.0})
    with pytest.raises(
        UserError, match=r"other\.ckpt: not the same model as 7\.ckpt \(encoder_conf is .*'num_heads': 4"
    ):
        average_checkpoints([paths[0], tmp_path / "other.ckpt"])
    # A setting of the training loss alone may change between checkpoints (a resumed run).
    models[2].set_cmvn(torch.linspace(-1.0, 1.0, 80), torch.full((80,), 2.0))
    models[2].config["ctc_weight"] = 0.5
    write_checkpoint(tmp_path / "12.ckpt", models[2], 12, {"12.ckpt": 1.0})
    assert torch.equal(average_checkpoints(paths)["model.cmvn.mean"], torch.linspace(-1.0, 1.0, 80))


def test_exported_model_loads_without_pickle_and_computes_the_same(run, tmp_path, monkeypatch):
    paths = select_checkpoints(run / "checkpoints", 3)
    avg = average_checkpoints(paths)
    config, tokenizer_path = model_config_from_checkpoint(paths[0])
    out = export_model(avg, config, tokenizer_path, tmp_path / "model")
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model.safetensors", "tokenizer.model"]
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["format_version"] == 1 and written["sample_rate"] == 16000
    assert (
        written["model"]["encoder_conf"]["num_layers"] == 2 and written["model"]["vocab_size"] == config["vocab_size"]
    )
    stored = load_file(out / "model.safetensors")
    assert set(stored) == {k.removeprefix("model.") for k in avg}
    assert torch.equal(stored["cmvn.istd"], avg["model.cmvn.istd"])

    source = ASRModel(**config)
    source.load_state_dict({k.removeprefix("model."): v for k, v in avg.items()})
    source.eval()

    def refuse(*args, **kwargs):
        raise AssertionError("load_model_dir unpickled something")

    with monkeypatch.context() as patch:
        for target, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
            patch.setattr(target, name, refuse)
        patch.setattr(torch.serialization, "load", refuse)
        model, tokenizer = load_model_dir(out)
    assert not model.training and tokenizer.vocab_size == model.vocab_size

    gen = torch.Generator().manual_seed(0)
    audio = 0.1 * torch.randn(2, 16000, generator=gen)
    lens = torch.tensor([16000, 11000])
    audio[1, 11000:] = 0.0
    with torch.no_grad():
        enc, enc_lens = model.encode(audio, lens)
        ref, ref_lens = source.encode(audio, lens)
        assert torch.equal(enc_lens, ref_lens) and enc.abs().max() > 0
        assert (enc - ref).abs().max() <= 1e-6
        assert (model.ctc_log_probs(enc) - source.ctc_log_probs(ref)).abs().max() <= 1e-6


def test_export_replaces_a_model_directory_and_refuses_anything_else(model_dir, char_tokenizer):
    model = seeded_model(1, char_tokenizer.vocab_size)
    export_model(model.state_dict(), model.config, char_tokenizer.path, model_dir, source={"note": "second"})
    assert yaml.safe_load((model_dir / "config.yaml").read_text())["source"] == {"note": "second"}
    assert torch.equal(load_file(model_dir / "model.safetensors")["ctc.weight"], model.ctc.weight)
    assert [p.name for p in model_dir.parent.iterdir()] == ["model"]  # no temporary directory left behind
    assert model_dir.stat().st_mode & 0o777 == 0o777 & ~_umask()

    precious = model_dir.parent / "exp"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match=r"exp: exists and is not a srupp-asr model directory; refusing to replace it"):
        export_model(model.state_dict(), model.config, char_tokenizer.path, precious)
    assert (precious / "notes.txt").read_text() == "keep me"
    with pytest.raises(UserError, match=r"the weights do not fit the model with this tokenizer \(missing weights"):
        export_model({"ctc.weight": model.ctc.weight}, model.config, char_tokenizer.path, model_dir)


def _umask() -> int:

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _rewrite_weights(path: Path, edit) -> None:
    weights = load_file(path)
    edit(weights)
    save_file(weights, path)


BREAKAGES = {
    "no directory": (lambda d: shutil.rmtree(d), "", r"model directory not found"),
    "a file": (lambda d: (shutil.rmtree(d), d.write_text("audio?")), "", r"is a file, not a model directory"),
    "no config": (
        lambda d: (d / "config.yaml").unlink(),
        "config.yaml",
        r"not found \(not a srupp-asr model directory\)",
    ),
    "bad yaml": (lambda d: (d / "config.yaml").write_text("model: [1,\n"), "config.yaml", r"not valid YAML at line 2"),
    "future format": (
        lambda d: (d / "config.yaml").write_text("format_version: 2\nmodel: {}\n"),
        "config.yaml",
        r"unknown format_version 2 \(this srupp-asr reads 1\)",
    ),
    "bad settings": (
        lambda d: (d / "config.yaml").write_text("format_version: 1\nmodel: {vocab_size: 60, width: 3}\n"),
        "config.yaml",
        r"bad model settings \(.*width",
    ),
    "other tokenizer": (
        lambda d: Tokenizer.train(["abc abd"], d / "tokenizer.model", vocab_size=60, model_type="char"),
        "tokenizer.model",
        r"tokenizer has 8 pieces, config.yaml says vocab_size \d+",
    ),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "model.safetensors", r"not found"),
    "garbage weights": (
        lambda d: (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{nope}"),
        "model.safetensors",
        r"not a readable safetensors file",
    ),
    "missing weight": (
        lambda d: _rewrite_weights(d / "model.safetensors", lambda w: w.pop("ctc.weight")),
        "model.safetensors",
        r"missing weights ctc\.weight$",
    ),
    "unexpected weight": (
        lambda d: _rewrite_weights(d / "model.safetensors", lambda w: w.update(extra=torch.ones(2))),
        "model.safetensors",
        r"unexpected weights extra$",
    ),
    "misshapen weight": (
        lambda d: _rewrite_weights(d / "model.safetensors", lambda w: w.update({"ctc.bias": torch.ones(3)})),
        "model.safetensors",
        r"ctc\.bias has shape \(3,\), the model expects",
    ),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_broken_model_directories_are_user_errors_naming_the_file(model_dir, breakage):
    breaks, file, message = BREAKAGES[breakage]
    breaks(model_dir)
    where = model_dir / file if file else model_dir
    with pytest.raises(UserError) as err:
        load_model_dir(model_dir)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{where}: ")
    assert err.match(message)


def test_average_command_exports_the_best_checkpoints(run, tmp_path, capsys):
    out = tmp_path / "final"
    assert main(["average", "--exp-dir", str(run), "--num", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "averaged 2 checkpoints (best by valid/loss, min):"
    chosen = select_checkpoints(run / "checkpoints", 2)
    for line, path in zip(printed[1:3], chosen, strict=True):
        assert line.startswith(f"  {path}  step {raw(path)['global_step']}  valid/loss=")
    assert printed[3] == f"wrote {out} (config.yaml, model.safetensors, tokenizer.model)"
    source = yaml.safe_load((out / "config.yaml").read_text())["source"]
    assert source["checkpoints"] == [p.name for p in chosen] and source["metric"] == "valid/loss"
    model, _ = load_model_dir(out)
    expected = average_checkpoints(chosen)["model.ctc.weight"]
    assert torch.equal(model.ctc.weight.detach(), expected)

    ckpts = [str(p) for p in chosen]
    assert main(["average", "--ckpts", *ckpts, "--out", str(out)]) == 0
    assert "averaged 2 checkpoints (best by valid/loss, min):" in capsys.readouterr().out


def test_average_command_on_an_empty_directory_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "exp" / "checkpoints").mkdir(parents=True)
    assert main(["average", "--exp-dir", str(tmp_path / "exp"), "--out", str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err
    assert err == f"srupp-asr average: error: {tmp_path / 'exp' / 'checkpoints'}: no checkpoints (*.ckpt) found\n"
    assert not (tmp_path / "model").exists()


# ------------------------------------------------------------------------------------------ shards and storage dtype

SHARD_LIMIT = 24_000  # the tiny model's weights are ~75 kB, its largest tensor 19.5 kB: 4 shards


def outputs(model: ASRModel) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder output and CTC log-probabilities of ``model`` on a fixed pair of noise clips."""
    audio = 0.1 * torch.randn(2, 8000, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        enc, _ = model.eval().encode(audio, torch.tensor([8000, 6000]))
        return enc, model.ctc_log_probs(enc)


def test_sharded_weights_respect_the_limit_and_load_as_the_single_file(tmp_path, char_tokenizer, model_dir):
    model = seeded_model(0, char_tokenizer.vocab_size)
    sharded = export_model(
        model.state_dict(), model.config, char_tokenizer.path, tmp_path / "sharded", max_shard_bytes=SHARD_LIMIT
    )
    shards = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    names = ["config.yaml", *shards, "model.safetensors.index.json", "tokenizer.model"]
    assert sorted(p.name for p in sharded.iterdir()) == names
    assert all((sharded / name).stat().st_size <= SHARD_LIMIT for name in shards)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    weights = model.state_dict()
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in weights.values())
    assert set(index["weight_map"]) == set(weights) and set(index["weight_map"].values()) == set(shards)
    for name in shards:
        assert set(load_file(sharded / name)) == {k for k, f in index["weight_map"].items() if f == name}

    assert all(torch.equal(read_weights(sharded)[k], weights[k]) for k in weights)
    assert {k: v.shape for k, v in read_weight_shapes(sharded).items()} == {k: v.shape for k, v in weights.items()}
    from_shards, from_file = outputs(load_model_dir(sharded)[0]), outputs(load_model_dir(model_dir)[0])
    assert all(torch.equal(a, b) for a, b in zip(from_shards, from_file, strict=True))


def test_weights_within_the_limit_stay_one_model_safetensors(tmp_path, char_tokenizer, model_dir):
    model = seeded_model(0, char_tokenizer.vocab_size)
    out = export_model(model.state_dict(), model.config, char_tokenizer.path, tmp_path / "fits", max_shard_bytes=10**6)
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model.safetensors", "tokenizer.model"]
    assert (out / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


def test_a_tensor_bigger_than_the_shard_limit_is_a_one_line_error(tmp_path, char_tokenizer):
    model = seeded_model(0, char_tokenizer.vocab_size)
    with pytest.raises(UserError) as err:
        export_model(model.state_dict(), model.config, char_tokenizer.path, tmp_path / "model", max_shard_bytes=10_000)
    assert str(err.value) == (
        f"{tmp_path / 'model'}: tensor subsampling.out.weight takes 19456 bytes, more than fits in a shard of 10000"
        " bytes"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary directory left


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_storage_halves_the_files_and_loads_the_rounded_weights(
    tmp_path, char_tokenizer, model_dir, dtype
):
    model = seeded_model(0, char_tokenizer.vocab_size, **TINY_CONFORMER)
    weights = model.state_dict()
    out = export_model(weights, model.config, char_tokenizer.path, tmp_path / "half", dtype=dtype)
    full = export_model(weights, model.config, char_tokenizer.path, tmp_path / "full")
    stored = load_file(out / "model.safetensors")
    halved = 0
    for key, value in stored.items():
        kept = key.startswith("cmvn.") or not weights[key].is_floating_point()
        assert value.dtype == (weights[key].dtype if kept else dtype), key
        halved += 0 if kept else value.nbytes
    assert sum(v.nbytes for v in stored.values()) + halved == sum(v.nbytes for v in weights.values())
    size, full_size = (out / "model.safetensors").stat().st_size, (full / "model.safetensors").stat().st_size
    assert size < 0.6 * full_size  # half the data; the tiny model's header (74 names) is a tenth of the file

    loaded, _ = load_model_dir(out)
    rounded = {k: v.to(stored[k].dtype).to(v.dtype) for k, v in weights.items()}
    for key, value in loaded.state_dict().items():
        assert value.dtype == weights[key].dtype and torch.equal(value, rounded[key]), key
    reference = ASRModel(**model.config)
    reference.load_state_dict(rounded)
    assert all(torch.equal(a, b) for a, b in zip(outputs(loaded), outputs(reference), strict=True))
    # and near the float32 model's, by the storage type's precision
    tolerance = {torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for a, b in zip(outputs(loaded), outputs(model), strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


def test_float16_refuses_weights_beyond_its_range(tmp_path, char_tokenizer):
    model = seeded_model(0, char_tokenizer.vocab_size)
    weights = {**model.state_dict(), "ctc.bias": torch.full_like(model.ctc.bias, 1e5)}
    with pytest.raises(UserError, match=r"model: ctc\.bias has values beyond the range of torch\.float16 \(store as"):
        export_model(weights, model.config, char_tokenizer.path, tmp_path / "model", dtype=torch.float16)
    out = export_model(weights, model.config, char_tokenizer.path, tmp_path / "model", dtype=torch.bfloat16)
    assert load_model_dir(out)[0].ctc.bias[0].item() == pytest.approx(1e5, rel=2**-8)


@pytest.mark.parametrize(
    ("text", "size"), [("15MiB", 15 * 2**20), ("500KB", 500_000), ("1.5 GiB", 3 * 2**29), ("4096", 4096)]
)
def test_sizes_take_decimal_and_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["15XB", "MiB", "-3", "0", "1e6", ""])
def test_a_bad_size_is_a_one_line_error(text):
    with pytest.raises(UserError, match=rf"^--max-shard-size: '{text}' is not a size \(examples: 15MiB"):
        parse_size(text, "--max-shard-size")


def test_average_command_writes_float16_shards(tmp_path, char_tokenizer, capsys):
    models = [seeded_model(seed, char_tokenizer.vocab_size) for seed in range(2)]
    ckpts = [write_checkpoint(tmp_path / f"{i}.ckpt", m, i, {f"{i}.ckpt": 1.0}) for i, m in enumerate(models)]
    out = tmp_path / "model"
    common = ["average", "--ckpts", *map(str, ckpts), "--tokenizer", str(char_tokenizer.path), "--out", str(out)]
    assert main([*common, "--max-shard-size", "15kB", "--dtype", "float16"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out} ({', '.join(files)})"
    shards = [name for name in files if name.startswith("model-")]
    assert len(shards) > 2 and "model.safetensors.index.json" in files
    assert all((out / name).stat().st_size <= 15_000 for name in shards)
    model, _ = load_model_dir(out)
    expected = average_checkpoints(ckpts)["model.ctc.weight"].half().float()
    assert torch.equal(model.ctc.weight.detach(), expected)

    assert main([*common, "--max-shard-size", "15XB"]) == 2
    assert capsys.readouterr().err == (
        "srupp-asr average: error: --max-shard-size: '15XB' is not a size (examples: 15MiB, 500KB, 1000000 bytes)\n"
    )
    assert files == sorted(p.name for p in out.iterdir())  # the model directory is untouched


def test_average_command_ships_an_lm_in_the_model_directory(tmp_path, char_tokenizer, capsys):
    from srupp_asr.lm import SRUppLM, load_lm, save_lm
    from srupp_asr.model_files import read_fusion_weight

    models = [seeded_model(seed, char_tokenizer.vocab_size) for seed in range(2)]
    ckpts = [write_checkpoint(tmp_path / f"{i}.ckpt", m, i, {f"{i}.ckpt": 1.0}) for i, m in enumerate(models)]
    torch.manual_seed(0)
    lm = SRUppLM(char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    out = tmp_path / "model"
    common = ["average", "--ckpts", *map(str, ckpts), "--tokenizer", str(char_tokenizer.path), "--out", str(out)]
    assert main([*common, "--lm", str(lm_dir), "--lm-weight", "0.45"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"with the LM of {lm_dir} as {out / 'lm'} (float16, default fusion weight 0.45)"
    )
    assert read_fusion_weight(out / "lm") == 0.45
    assert load_file(out / "lm" / "model.safetensors")["out.weight"].dtype == torch.float16
    shipped, _ = load_lm(out / "lm")
    assert torch.equal(shipped.out.weight, lm.out.weight.half().float())
    load_model_dir(out)  # the model directory itself reads as before

    # Without --lm-weight: the LM's own recorded weight, else 0.3; --lm-weight alone, or a bad LM, writes nothing.
    assert main([*common, "--lm", str(out / "lm"), "--out", str(tmp_path / "again")]) == 0
    assert read_fusion_weight(tmp_path / "again" / "lm") == 0.45
    assert main([*common, "--lm", str(lm_dir), "--out", str(tmp_path / "third")]) == 0
    assert read_fusion_weight(tmp_path / "third" / "lm") == 0.3
    capsys.readouterr()
    assert main([*common, "--lm-weight", "0.3"]) == 2
    assert capsys.readouterr().err == (
        "srupp-asr average: error: --lm-weight needs --lm (the LM directory to put into the model directory)\n"
    )
    other = Tokenizer.train(["zzz yyy"] * 5, tmp_path / "other.model", 8, "char")
    save_lm(SRUppLM(other.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2), other.path, tmp_path / "o")
    before = sorted(p.name for p in out.iterdir())
    assert main([*common, "--lm", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the LM's tokenizer differs from the ASR model's" in err
    assert main([*common, "--lm", str(lm_dir), "--lm-weight", "nan"]) == 2
    assert "--lm-weight must be a number in [0, 1000], got nan" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before and read_fusion_weight(out / "lm") == 0.45


def test_average_lms_writes_the_mean_of_lms_of_one_shape_and_tokenizer(tmp_path, char_tokenizer):
    from srupp_asr.average import average_lms
    from srupp_asr.lm import SRUppLM, load_lm, save_lm

    lms = []
    for seed in range(3):
        torch.manual_seed(seed)
        lms.append(SRUppLM(char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2))
    dirs = [save_lm(lm, char_tokenizer.path, tmp_path / f"lm{i}") for i, lm in enumerate(lms)]
    out = average_lms(dirs, tmp_path / "soup")
    soup, _ = load_lm(out)
    for key, value in soup.state_dict().items():  # against a float64 mean of the weights as built
        mean = sum(lm.state_dict()[key].double() for lm in lms) / 3
        assert value.dtype == torch.float32 and torch.allclose(value.double(), mean, atol=1e-7), key
    # Another shape, another tokenizer, one LM only: one line naming the LM, nothing written.
    wide = save_lm(
        SRUppLM(char_tokenizer.vocab_size, d_model=32, num_layers=1, attn_dim=8, num_heads=2),
        char_tokenizer.path,
        tmp_path / "wide",
    )
    other = Tokenizer.train(["zzz yyy"] * 5, tmp_path / "other.model", 8, "char")
    foreign = save_lm(
        SRUppLM(other.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2), other.path, tmp_path / "foreign"
    )
    for bad, message in [
        ([dirs[0], wide], f"{wide}: another LM shape than {dirs[0]}"),
        ([dirs[0], foreign], f"{foreign}: the LM's tokenizer differs"),
        ([dirs[0]], "give at least two LM directories"),
    ]:
        with pytest.raises(UserError, match=message):
            average_lms(bad, tmp_path / "bad")
        assert not (tmp_path / "bad").exists()


# ------------------------------------------------------------ against independent references


def _set_tokenizer(path: Path, tokenizer: Path) -> Path:
    """Rewrite checkpoint ``path`` as trained with ``tokenizer`` (its ``hyper_parameters``)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    ckpt["hyper_parameters"]["tokenizer"] = str(tokenizer)
    torch.save(ckpt, path)
    return path


def _reference_mean(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The float64 mean of the floating weights of ``paths``, read with plain torch.load, cast to their dtype."""
    states = [torch.load(p, map_location="cpu", weights_only=True)["state_dict"] for p in paths]
    return {
        k: (sum(s[k].double() for s in states) / len(states)).to(v.dtype)
        for k, v in states[0].items()
        if v.is_floating_point()
    }


def _noise() -> tuple[torch.Tensor, torch.Tensor]:
    audio = 0.1 * torch.randn(2, 8000, generator=torch.Generator().manual_seed(0))
    return audio, torch.tensor([8000, 5600])


def test_a_checkpoint_with_nan_weights_is_refused_not_averaged_into_a_nan_model(tmp_path, char_tokenizer, capsys):
    # Was: one NaN in 2.ckpt's ctc.weight (its valid/loss stored as inf, as Lightning stores a NaN score) and
    # `average --exp-dir EXP --num 10` chose all 3 checkpoints (the inf one last), exited 0 and wrote a model
    # whose CTC log-probs were 100% NaN (1.0 of them), with no warning.
    models = [seeded_model(seed, char_tokenizer.vocab_size) for seed in range(3)]
    with torch.no_grad():
        models[2].ctc.weight[0, 0] = float("nan")
    scores = [1.0, 1.2, float("inf")]
    ckpts = tmp_path / "exp" / "checkpoints"
    ckpts.mkdir(parents=True)
    for i, (model, score) in enumerate(zip(models, scores, strict=True)):
        write_checkpoint(ckpts / f"{i}.ckpt", model, i + 1, {f"{i}.ckpt": score})
    assert [c.path.name for c in select(ckpts, 10).checkpoints] == ["0.ckpt", "1.ckpt", "2.ckpt"]

    out = tmp_path / "model"
    argv = ["average", "--exp-dir", str(tmp_path / "exp"), "--num", "10", "--tokenizer", str(char_tokenizer.path)]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"srupp-asr average: error: {ckpts / '2.ckpt'}: model.ctc.weight holds 1 non-finite value (NaN or inf: a"
        " diverged checkpoint?); averaging it would make the model's outputs NaN, leave it out\n"
    )
    assert not out.exists()
    # Without it, the average is that of the finite two, equal to the independent float64 mean.
    assert main([*argv, "--num", "2", "--out", str(out)]) == 0
    reference = _reference_mean([ckpts / "0.ckpt", ckpts / "1.ckpt"])
    stored = load_file(out / "model.safetensors")
    assert all(torch.equal(stored[k.removeprefix("model.")], v) for k, v in reference.items())


def test_checkpoints_trained_with_different_tokenizers_are_refused(tmp_path, char_tokenizer):
    # Was: two checkpoints whose runs used tokenizers of the same size (25) but other pieces (the characters
    # ordered by another corpus's counts) were averaged without a word: only the network settings, weight
    # shapes and CMVN were compared, and the model shipped the first one's tokenizer, so 21 of the 25 averaged
    # output rows mixed two different characters.
    other = Tokenizer.train(
        [*CHAR_CORPUS, "yyyyyyyyyyyyyyyy pppppppppppppppp xxxxxxxxxxxxxxxx"],
        tmp_path / "other.model",
        vocab_size=60,
        model_type="char",
    )
    assert other.vocab_size == char_tokenizer.vocab_size and other.pieces() != char_tokenizer.pieces()
    models = [seeded_model(seed, char_tokenizer.vocab_size) for seed in range(2)]
    a = _set_tokenizer(write_checkpoint(tmp_path / "a.ckpt", models[0], 1, {"a.ckpt": 1.0}), char_tokenizer.path)
    b = _set_tokenizer(write_checkpoint(tmp_path / "b.ckpt", models[1], 2, {"b.ckpt": 1.1}), other.path)
    with pytest.raises(UserError) as err:
        average_checkpoints([a, b])
    assert str(err.value) == (
        f"{b}: trained with tokenizer {other.path}, a.ckpt with {char_tokenizer.path}, whose pieces differ (the same"
        " output id means other text); average checkpoints of one run"
    )
    # The same tokenizer under another path (a run resumed from a copied tokenizer) is fine.
    copy = shutil.copyfile(char_tokenizer.path, tmp_path / "copy.model")
    _set_tokenizer(b, copy)
    avg = average_checkpoints([a, b])
    reference = _reference_mean([a, b])
    assert all(torch.equal(avg[k], v) for k, v in reference.items())


def test_averaged_export_matches_the_lightning_module_bit_for_bit_and_decodes_the_same(tmp_path, char_tokenizer):
    """Against the checkpoints' own LightningModule: float32 export bit for bit; float16 within its rounding."""
    network = {k: v for k, v in TINY_CONFORMER.items()}
    models = [seeded_model(seed, char_tokenizer.vocab_size, **network) for seed in range(3)]
    for i, model in enumerate(models):  # BatchNorm statistics and counters that differ per checkpoint
        for name, buffer in model.named_buffers():
            if "running" in name:
                buffer.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(i))
            elif name.endswith("num_batches_tracked"):
                buffer.fill_(10 * (i + 1))
    ckpts = [
        write_checkpoint(tmp_path / f"{i}.ckpt", m, 10 * (i + 1), {f"{i}.ckpt": 1.0}) for i, m in enumerate(models)
    ]
    avg = average_checkpoints(ckpts)
    reference = _reference_mean(ckpts)
    assert all(torch.equal(avg[k], v) for k, v in reference.items())
    counters = [k for k, v in avg.items() if not v.is_floating_point()]
    assert counters and all(avg[k].dtype == torch.int64 and avg[k].item() == 30 for k in counters)

    module = ASRLightningModule(str(char_tokenizer.path), **network)
    module.load_state_dict(avg, strict=True)  # the Lightning keys, as a resumed run would load them
    module.eval()
    full, _ = load_model_dir(export_model(avg, models[0].config, char_tokenizer.path, tmp_path / "full"))
    half, _ = load_model_dir(
        export_model(
            avg, models[0].config, char_tokenizer.path, tmp_path / "half", dtype=torch.float16, max_shard_bytes=10_000
        )
    )
    assert len(list((tmp_path / "half").glob("model-*.safetensors"))) > 1
    audio, lens = _noise()
    with torch.no_grad():
        ref_enc, ref_lens = module.model.encode(audio, lens)
        enc, enc_lens = full.encode(audio, lens)
        assert torch.equal(enc, ref_enc) and torch.equal(enc_lens, ref_lens)
        assert torch.equal(full.ctc_log_probs(enc), module.model.ctc_log_probs(ref_enc))
        assert full.ctc_greedy(audio, lens) == module.model.ctc_greedy(audio, lens)
        # float16 keeps 11 significant bits: each weight moves by at most 2**-12 of itself; through this
        # 1-layer network the log-probs move by 2.2e-4 (measured): 2e-3 leaves a margin of 10.
        half_lp = half.ctc_log_probs(half.encode(audio, lens)[0])
        torch.testing.assert_close(half_lp, module.model.ctc_log_probs(ref_enc), rtol=0, atol=2e-3)
    assert torch.equal(half.cmvn.mean, module.model.cmvn.mean) and torch.equal(half.cmvn.istd, module.model.cmvn.istd)
    assert (tmp_path / "full" / "tokenizer.model").read_bytes() == char_tokenizer.path.read_bytes()


@pytest.mark.parametrize("limit", [19_700, 20_011, 23_333, 31_007, 40_961])
def test_shards_cut_anywhere_reassemble_to_the_unsharded_weights(tmp_path, char_tokenizer, limit):
    """Limits just above the largest tensor (19 456 bytes) and at odd sizes: every shard within the limit, and
    the shards' tensors, read with plain safetensors, are exactly the single file's."""
    model = seeded_model(0, char_tokenizer.vocab_size, **TINY_CONFORMER)
    single = export_model(model.state_dict(), model.config, char_tokenizer.path, tmp_path / "single")
    sharded = export_model(
        model.state_dict(), model.config, char_tokenizer.path, tmp_path / "sharded", max_shard_bytes=limit
    )
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and all(p.stat().st_size <= limit for p in shards)
    reassembled: dict[str, torch.Tensor] = {}
    for shard in shards:
        part = load_file(shard)
        assert not reassembled.keys() & part.keys()
        reassembled.update(part)
    expected = load_file(single / "model.safetensors")
    assert reassembled.keys() == expected.keys()
    assert all(torch.equal(reassembled[k], v) and reassembled[k].dtype == v.dtype for k, v in expected.items())


# ---- bad inputs to `srupp-asr average`: one line naming the file or option, nothing taken for a result ----


@pytest.fixture
def ckpts(tmp_path: Path, char_tokenizer) -> list[Path]:
    folder = tmp_path / "ckpts"
    folder.mkdir()
    models = [seeded_model(seed, char_tokenizer.vocab_size) for seed in range(2)]
    return [write_checkpoint(folder / f"{i}.ckpt", m, i, {f"{i}.ckpt": 1.0}) for i, m in enumerate(models)]


def _average(tokenizer, out: Path, *paths: str | Path) -> int:
    return main(["average", "--ckpts", *map(str, paths), "--tokenizer", str(tokenizer.path), "--out", str(out)])


@pytest.mark.parametrize("spelling", ["same path", "other spelling", "symbolic link"])
def test_average_refuses_a_checkpoint_given_twice(ckpts, char_tokenizer, tmp_path, capsys, spelling):
    # was: averaged as if it were two checkpoints (its weights counted double)
    first = ckpts[0]
    second = {
        "same path": first,
        "other spelling": first.parent / "." / first.name,
        "symbolic link": tmp_path / "link.ckpt",
    }[spelling]
    if spelling == "symbolic link":
        second.symlink_to(first)
    out = tmp_path / "model"
    assert _average(char_tokenizer, out, first, ckpts[1], second) == 2
    line = one_line_error(capsys, "average")
    if spelling == "symbolic link":
        assert line == f"{second}: the same file as {first}; each checkpoint is averaged once"
    else:
        assert line == f"{first}: given twice; each checkpoint is averaged once"
    assert not out.exists()
    with pytest.raises(UserError, match="each checkpoint is averaged once"):
        average_checkpoints([first, second])


def test_average_names_an_empty_or_truncated_checkpoint(ckpts, char_tokenizer, tmp_path, capsys):
    # was (empty): "not a readable PyTorch checkpoint (mmap can only be used with files saved with ...)"
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    out = tmp_path / "model"
    assert _average(char_tokenizer, out, ckpts[0], empty) == 2
    assert one_line_error(capsys, "average") == f"{empty}: empty file (0 bytes), not a checkpoint"

    truncated = tmp_path / "truncated.ckpt"
    data = ckpts[1].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    assert _average(char_tokenizer, out, ckpts[0], truncated) == 2
    assert one_line_error(capsys, "average") == (
        f"{truncated}: not a readable PyTorch checkpoint (not a zip archive: truncated or corrupt?)"
    )
    assert not out.exists()

    # the same in a run's checkpoint folder (--exp-dir)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    shutil.copy(ckpts[0], run / "a.ckpt")
    (run / "b.ckpt").write_bytes(b"")
    assert main(["average", "--exp-dir", str(run.parent), "--out", str(out)]) == 2
    assert one_line_error(capsys, "average") == f"{run / 'b.ckpt'}: empty file (0 bytes), not a checkpoint"


def test_average_of_distinct_checkpoints_still_works(ckpts, char_tokenizer, tmp_path, capsys):
    out = tmp_path / "model"
    assert _average(char_tokenizer, out, *ckpts) == 0
    assert capsys.readouterr().out.startswith("averaged 2 checkpoints")


def _crafted(path: Path, **changes) -> Path:
    """A copy of checkpoint ``path`` with entries changed (``state_dict_entry`` adds one to its state_dict)."""
    ckpt = torch.load(path, weights_only=True)
    for key, value in changes.items():
        if key == "state_dict_entry":
            ckpt["state_dict"]["model.extra"] = value
        else:
            ckpt[key] = value
    crafted = path.with_name(f"crafted-{path.name}")
    torch.save(ckpt, crafted)
    return crafted


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"hyper_parameters": [1, 2]}, "hyper_parameters is a list, not a mapping (not a Lightning checkpoint)"),
        ({"global_step": "abc"}, "global_step is 'abc', not a whole number (not a Lightning checkpoint)"),
        ({"global_step": float("nan")}, "global_step is nan, not a whole number (not a Lightning checkpoint)"),
        ({"state_dict_entry": 7}, "state_dict entry 'model.extra' is int, not a tensor (not a Lightning checkpoint)"),
        ({"callbacks": [1, 2]}, None),  # not a monitor's state: averaged, unranked
    ],
)
def test_average_of_a_crafted_checkpoint_is_one_line_not_a_traceback(
    ckpts, char_tokenizer, tmp_path, capsys, change, says
):
    crafted = _crafted(ckpts[1], **change)
    out = tmp_path / "model"
    status = _average(char_tokenizer, out, ckpts[0], crafted)
    if says is None:
        assert status == 0 and out.is_dir()
        return
    assert status == 2
    assert one_line_error(capsys, "average") == f"{crafted}: {says}"
    assert not out.exists()


def test_a_checkpoint_holding_code_is_refused_without_torchs_advice_to_load_it_unsafely(
    ckpts, char_tokenizer, tmp_path, capsys
):
    ckpt = torch.load(ckpts[1], weights_only=True)
    ckpt["payload"] = os.system  # a pickled callable: torch.load(weights_only=True) refuses it
    evil = tmp_path / "evil.ckpt"
    torch.save(ckpt, evil)
    assert _average(char_tokenizer, tmp_path / "model", ckpts[0], evil) == 2
    line = one_line_error(capsys, "average")
    assert line.startswith(f"{evil}: holds Python objects other than tensors and plain data: unsupported GLOBAL")
    assert line.endswith("(refused unread: they could run code)") and "weights_only" not in line
