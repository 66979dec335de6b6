"""Audit of ``srupp-asr average`` and model directories against independent references: a float64 mean of the
checkpoints read with plain ``torch.load(weights_only=True)``, ``safetensors.torch.load_file``, and the
LightningModule the checkpoints come from."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.export import average_checkpoints, select
from srupp_asr.lightning_module import ASRLightningModule
from srupp_asr.model_dir import export_model, load_model
from srupp_asr.tokenizer import Tokenizer
from tests.test_export import TINY_CONFORMER, seeded_model, write_checkpoint
from tests.test_train import SPOKEN

CORPUS = [*SPOKEN, "one two three four five six seven"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("lang") / "tokenizer.model"
    return Tokenizer.train(CORPUS, path, vocab_size=60, model_type="char")


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


# ------------------------------------------------------------------------------------------ findings


def test_a_checkpoint_with_nan_weights_is_refused_not_averaged_into_a_nan_model(tmp_path, tokenizer, capsys):
    # Was: one NaN in 2.ckpt's ctc.weight (its valid/loss stored as inf, as Lightning stores a NaN score) and
    # `average --exp-dir EXP --num 10` chose all 3 checkpoints (the inf one last), exited 0 and wrote a model
    # whose CTC log-probs were 100% NaN (1.0 of them), with no warning.
    models = [seeded_model(seed, tokenizer.vocab_size) for seed in range(3)]
    with torch.no_grad():
        models[2].ctc.weight[0, 0] = float("nan")
    scores = [1.0, 1.2, float("inf")]
    ckpts = tmp_path / "exp" / "checkpoints"
    ckpts.mkdir(parents=True)
    for i, (model, score) in enumerate(zip(models, scores, strict=True)):
        write_checkpoint(ckpts / f"{i}.ckpt", model, i + 1, {f"{i}.ckpt": score})
    assert [c.path.name for c in select(ckpts, 10).checkpoints] == ["0.ckpt", "1.ckpt", "2.ckpt"]

    out = tmp_path / "model"
    argv = ["average", "--exp-dir", str(tmp_path / "exp"), "--num", "10", "--tokenizer", str(tokenizer.path)]
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


def test_checkpoints_trained_with_different_tokenizers_are_refused(tmp_path, tokenizer):
    # Was: two checkpoints whose runs used tokenizers of the same size (25) but other pieces (the characters
    # ordered by another corpus's counts) were averaged without a word: only the network settings, weight
    # shapes and CMVN were compared, and the model shipped the first one's tokenizer, so 21 of the 25 averaged
    # output rows mixed two different characters.
    other = Tokenizer.train(
        [*CORPUS, "yyyyyyyyyyyyyyyy pppppppppppppppp xxxxxxxxxxxxxxxx"],
        tmp_path / "other.model",
        vocab_size=60,
        model_type="char",
    )
    assert other.vocab_size == tokenizer.vocab_size and other.pieces() != tokenizer.pieces()
    models = [seeded_model(seed, tokenizer.vocab_size) for seed in range(2)]
    a = _set_tokenizer(write_checkpoint(tmp_path / "a.ckpt", models[0], 1, {"a.ckpt": 1.0}), tokenizer.path)
    b = _set_tokenizer(write_checkpoint(tmp_path / "b.ckpt", models[1], 2, {"b.ckpt": 1.1}), other.path)
    with pytest.raises(UserError) as err:
        average_checkpoints([a, b])
    assert str(err.value) == (
        f"{b}: trained with tokenizer {other.path}, a.ckpt with {tokenizer.path}, whose pieces differ (the same"
        " output id means other text); average checkpoints of one run"
    )
    # The same tokenizer under another path (a run resumed from a copied tokenizer) is fine.
    copy = shutil.copyfile(tokenizer.path, tmp_path / "copy.model")
    _set_tokenizer(b, copy)
    avg = average_checkpoints([a, b])
    reference = _reference_mean([a, b])
    assert all(torch.equal(avg[k], v) for k, v in reference.items())


@pytest.mark.skipif(sys.platform != "linux", reason="the one-step exchange is renameat2(RENAME_EXCHANGE), Linux only")
def test_replacing_a_model_directory_never_leaves_the_path_without_a_whole_model(tmp_path, tokenizer, monkeypatch):
    # Was: the old directory was renamed aside (.model.<uuid>.old) and then the new one renamed in: between the
    # two renames `model` did not exist (1 of the 3 states observed below was "no model"), so a transcribe
    # starting then failed with "model directory not found" and a kill -9 there left no model at the path,
    # the old one hidden under a name that no later run sweeps.
    first, second = seeded_model(0, tokenizer.vocab_size), seeded_model(1, tokenizer.vocab_size)
    out = export_model(first.state_dict(), first.config, tokenizer.path, tmp_path / "model")

    def whole() -> bool:
        names = ("config.yaml", "model.safetensors", "tokenizer.model")
        return all((out / name).is_file() for name in names)

    observed: list[bool] = []
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        observed.append(whole())

    def rmtree(path, *args, **kwargs):
        observed.append(whole())  # the displaced old directory is being removed
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    export_model(second.state_dict(), second.config, tokenizer.path, out)
    monkeypatch.undo()
    assert observed and all(observed), observed
    assert torch.equal(load_file(out / "model.safetensors")["ctc.weight"], second.ctc.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # nothing of the old directory left beside it


# ------------------------------------------------------------------------------------------ areas found clean


def test_averaged_export_matches_the_lightning_module_bit_for_bit_and_decodes_the_same(tmp_path, tokenizer):
    """Against the checkpoints' own LightningModule: float32 export bit for bit; float16 within its rounding."""
    network = {k: v for k, v in TINY_CONFORMER.items()}
    models = [seeded_model(seed, tokenizer.vocab_size, **network) for seed in range(3)]
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

    module = ASRLightningModule(str(tokenizer.path), **network)
    module.load_state_dict(avg, strict=True)  # the Lightning keys, as a resumed run would load them
    module.eval()
    full, _ = load_model(export_model(avg, models[0].config, tokenizer.path, tmp_path / "full"))
    half, _ = load_model(
        export_model(
            avg, models[0].config, tokenizer.path, tmp_path / "half", dtype=torch.float16, max_shard_bytes=10_000
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
    assert (tmp_path / "full" / "tokenizer.model").read_bytes() == tokenizer.path.read_bytes()


@pytest.mark.parametrize("limit", [19_700, 20_011, 23_333, 31_007, 40_961])
def test_shards_cut_anywhere_reassemble_to_the_unsharded_weights(tmp_path, tokenizer, limit):
    """Limits just above the largest tensor (19 456 bytes) and at odd sizes: every shard within the limit, and
    the shards' tensors, read with plain safetensors, are exactly the single file's."""
    model = seeded_model(0, tokenizer.vocab_size, **TINY_CONFORMER)
    single = export_model(model.state_dict(), model.config, tokenizer.path, tmp_path / "single")
    sharded = export_model(
        model.state_dict(), model.config, tokenizer.path, tmp_path / "sharded", max_shard_bytes=limit
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
