"""Compute types (``--compute-type``): int8 quantises every Linear of the ASR model per output channel, checked
against the float32 weights and outputs; the recurrence and attention still get float32; int8 is CPU-only.
bfloat16 runs the encoder's convolutions and matrix products in bfloat16 (outputs checked against float32), leaves
training's own autocast alone, and is refused where the device has no native bfloat16. The option reaches the
loaded model from the command line and the Python API."""

from __future__ import annotations

import pytest
import torch

import srupp_asr
import srupp_asr.sru
from srupp_asr.compute_types import apply_compute_type, check_compute_type
from srupp_asr.errors import UserError
from srupp_asr.loading import compute_device
from srupp_asr.runtime.engine import NumpyASR
from tests.helpers import seeded_model, write_tone

PER_CHANNEL_SYMMETRIC = torch.per_channel_symmetric
TWO_LAYERS = {"encoder_conf": {"d_model": 32, "num_layers": 2, "attn_dim": 16, "num_heads": 2}}  # one with attention


def _int8(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return apply_compute_type(copy.deepcopy(model).eval(), "int8")


def _linears(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_int8_stores_each_linear_weight_within_half_a_step_per_output_row():
    model = seeded_model(0, 40, **TWO_LAYERS).eval()
    floats, quantised = _linears(model), dict(_int8(model).named_modules())
    assert floats, "the model has Linear layers"
    for name, linear in floats.items():
        q = quantised[name]
        assert not isinstance(q, torch.nn.Linear), f"{name} was left float32"
        stored = q.weight()
        assert stored.dtype == torch.qint8 and stored.qscheme() in (
            torch.per_channel_affine,
            torch.per_channel_symmetric,
        )
        assert (stored.q_per_channel_zero_points() == 0).all()
        w = linear.weight.detach()
        steps = stored.q_per_channel_scales().float()
        # symmetric: each row's step is its largest magnitude over 127.5 (torch's qint8 observer)
        torch.testing.assert_close(steps, w.abs().amax(1) / 127.5, rtol=1e-5, atol=1e-8)
        assert ((stored.dequantize() - w).abs() <= steps[:, None] / 2 + 1e-7).all()
        torch.testing.assert_close(q.bias(), linear.bias.detach() if linear.bias is not None else None)


def test_int8_ctc_log_probs_stay_close_to_float32():
    model = seeded_model(0, 40, **TWO_LAYERS).eval()
    audio = torch.randn(2, 16000, generator=torch.Generator().manual_seed(1)) * 0.1
    lens = torch.tensor([16000, 12000])
    with torch.inference_mode():
        ref = model.ctc_log_probs(model.encode(audio, lens)[0])
        got = _int8(model).ctc_log_probs(_int8(model).encode(audio, lens)[0])
    assert ((got - ref).norm() / ref.norm()).item() < 0.05
    assert (got.exp() - ref.exp()).abs().max().item() < 0.05


def test_int8_gives_the_recurrence_and_attention_float32_inputs(monkeypatch):
    seen: dict[str, list[torch.dtype]] = {"recurrence": [], "attention": []}
    recurrence, attention = srupp_asr.sru.sru_recurrence, torch.nn.functional.scaled_dot_product_attention

    def record_recurrence(u, x, *args, **kwargs):
        seen["recurrence"] += [u.dtype, x.dtype]
        return recurrence(u, x, *args, **kwargs)

    def record_attention(q, k, v, *args, **kwargs):
        seen["attention"] += [q.dtype, k.dtype, v.dtype]
        return attention(q, k, v, *args, **kwargs)

    monkeypatch.setattr(srupp_asr.sru, "sru_recurrence", record_recurrence)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", record_attention)
    model = _int8(seeded_model(0, 40, **TWO_LAYERS))
    with torch.inference_mode():
        model.encode(torch.randn(1, 8000) * 0.1, torch.tensor([8000]))
    assert seen["recurrence"] == [torch.float32] * 4  # two layers' (u, x)
    assert seen["attention"] and set(seen["attention"]) == {torch.float32}


def test_int8_runs_on_the_cpu_only():
    assert compute_device("int8", "auto") == "cpu"
    assert compute_device("int8", "cpu") == "cpu"
    with pytest.raises(
        UserError, match=r"^--compute-type int8 runs on the CPU only, not on meta \(use --device cpu\)$"
    ):
        apply_compute_type(seeded_model(0, 40).to("meta"), "int8")
    with pytest.raises(UserError, match="--device cuda"):  # no GPU: resolving it says so; with one: int8 refuses it
        compute_device("int8", "cuda")


def test_an_unknown_compute_type_is_one_line():
    with pytest.raises(UserError, match=r"^--compute-type float16: unknown \(choose float32, int8 or bfloat16\)$"):
        check_compute_type("float16")
    with pytest.raises(UserError, match="float16: unknown"):
        compute_device("float16", "cpu")


def test_float32_leaves_the_model_as_it_is():
    model = seeded_model(0, 40)
    assert apply_compute_type(model, "float32") is model and _linears(model)


def test_the_python_api_and_transcribe_load_int8_when_asked(model_dir, tmp_path):
    loaded = srupp_asr.load_model(model_dir, device="cpu", compute_type="int8")
    assert not _linears(loaded.net)
    assert not _linears(srupp_asr.load_model(model_dir, device="auto", compute_type="int8").net)
    # float32 by default: on the CPU the numpy runtime's network, the torch one (all Linear layers kept) when asked
    assert isinstance(srupp_asr.load_model(model_dir, device="cpu").net, NumpyASR)
    assert _linears(srupp_asr.load_model(model_dir, device="cpu", engine="torch").net)
    with pytest.raises(TypeError, match="'compute_type'"):
        loaded.transcribe(write_tone(tmp_path / "tone.wav", 0.5), compute_type="float32")


def test_the_command_line_passes_compute_type_to_the_loader(model_dir, tmp_path, monkeypatch, capsys):
    from srupp_asr.cli import main
    from srupp_asr.loading import LoadedModel

    asked: list[tuple[str, str]] = []
    load = LoadedModel.load.__func__

    def spy(cls, name_or_dir=None, device="auto", compute_type="float32", engine="auto"):
        asked.append((compute_type, engine))
        return load(cls, name_or_dir, device, compute_type, engine)

    monkeypatch.setattr(LoadedModel, "load", classmethod(spy))
    wav = write_tone(tmp_path / "tone.wav", 0.5)
    for flag in ("--compute-type", "--compute_type"):
        assert main(["transcribe", str(wav), "--model", str(model_dir), "--no-lm", "-q", flag, "int8"]) == 0
    assert main(["transcribe", str(wav), "--model", str(model_dir), "--no-lm", "-q"]) == 0
    assert main(["transcribe", str(wav), "--model", str(model_dir), "--no-lm", "-q", "--engine", "torch"]) == 0
    assert asked == [("int8", "auto"), ("int8", "auto"), ("float32", "auto"), ("float32", "torch")]
    with pytest.raises(SystemExit) as refused:
        main(["transcribe", str(wav), "--compute_type", "float16"])
    assert refused.value.code == 2
    assert (
        "--compute-type/--compute_type: invalid choice: 'float16' (choose from 'float32', 'int8', 'bfloat16')"
        in capsys.readouterr().err
    )


NATIVE_BF16 = pytest.mark.skipif(
    not __import__("srupp_asr.compute_types").compute_types.native_bfloat16(torch.device("cpu")),
    reason="this CPU has no native bfloat16 (AVX512-BF16 or AMX): --compute-type bfloat16 is refused here",
)


def _bf16(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return apply_compute_type(copy.deepcopy(model).eval(), "bfloat16")


@NATIVE_BF16
def test_bfloat16_encoder_output_is_float32_and_close_to_float32_with_the_weights_untouched():
    model = seeded_model(0, 40, **TWO_LAYERS).eval()
    audio = torch.randn(2, 16000, generator=torch.Generator().manual_seed(1)) * 0.1
    lens = torch.tensor([16000, 12000])
    bf16 = _bf16(model)
    with torch.inference_mode():
        ref_enc, ref_lens = model.encode(audio, lens)
        enc, enc_lens = bf16.encode(audio, lens)
        ref, got = model.ctc_log_probs(ref_enc), bf16.ctc_log_probs(enc)
    assert enc.dtype == torch.float32 and torch.equal(enc_lens, ref_lens)
    assert not torch.equal(enc, ref_enc)  # it did run in bfloat16
    assert ((enc - ref_enc).norm() / ref_enc.norm()).item() < 0.03
    assert (got.exp() - ref.exp()).abs().max().item() < 0.05
    assert {p.dtype for p in bf16.parameters()} == {torch.float32}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), bf16.state_dict().values(), strict=True))


@NATIVE_BF16
def test_bfloat16_feeds_the_convolutions_linears_and_recurrence_bfloat16_and_the_ctc_head_float32(monkeypatch):
    seen: dict[str, set[torch.dtype]] = {"conv": set(), "linear": set(), "recurrence": set()}
    conv, linear, recurrence = torch.nn.functional.conv2d, torch.nn.functional.linear, srupp_asr.sru.sru_recurrence

    def record_conv(x, *args, **kwargs):
        out = conv(x, *args, **kwargs)
        seen["conv"].add(out.dtype)
        return out

    def record_linear(x, *args, **kwargs):
        out = linear(x, *args, **kwargs)
        seen["linear"].add(out.dtype)
        return out

    def record_recurrence(u, x, *args, **kwargs):
        seen["recurrence"] |= {u.dtype, x.dtype}
        return recurrence(u, x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv2d", record_conv)
    monkeypatch.setattr(torch.nn.functional, "linear", record_linear)
    monkeypatch.setattr(srupp_asr.sru, "sru_recurrence", record_recurrence)
    model = _bf16(seeded_model(0, 40, **TWO_LAYERS))
    with torch.inference_mode():
        enc, _ = model.encode(torch.randn(1, 8000) * 0.1, torch.tensor([8000]))
        logits = model.ctc_log_probs(enc)
    assert seen["conv"] == {torch.bfloat16} and torch.bfloat16 in seen["linear"]
    # bfloat16 u from the autocast Linear; the recurrence computes bfloat16 inputs in float32 (tests/test_recurrence.py)
    assert torch.bfloat16 in seen["recurrence"]
    assert logits.dtype == torch.float32  # the CTC head runs outside the encoder's autocast


def test_without_a_compute_type_encode_leaves_the_callers_autocast_alone():
    """Training (bf16-mixed) runs ``encode`` under its own autocast: the model must neither widen nor narrow it."""
    model = seeded_model(0, 40, **TWO_LAYERS).eval()
    assert model.encoder_autocast is None
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        enc, _ = model.encode(torch.randn(1, 8000) * 0.1, torch.tensor([8000]))
    assert enc.dtype == torch.bfloat16
    with torch.inference_mode():
        assert model.encode(torch.randn(1, 8000) * 0.1, torch.tensor([8000]))[0].dtype == torch.float32


def test_bfloat16_is_refused_in_one_line_where_the_cpu_has_no_native_bfloat16(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    line = (
        r"^--compute-type bfloat16 needs native bfloat16 arithmetic and this CPU has neither AVX512-BF16 nor AMX: "
        r"it would run slower than float32 here \(use float32 or int8\)$"
    )
    with pytest.raises(UserError, match=line):
        compute_device("bfloat16", "cpu")
    with pytest.raises(UserError, match=line):
        apply_compute_type(seeded_model(0, 40), "bfloat16")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # AMX alone is enough
    assert compute_device("bfloat16", "cpu") == "cpu"


@NATIVE_BF16
def test_the_python_api_and_the_command_line_load_bfloat16_when_asked(model_dir, tmp_path, monkeypatch):
    from srupp_asr.cli import main
    from srupp_asr.loading import LoadedModel

    loaded = srupp_asr.load_model(model_dir, device="cpu", compute_type="bfloat16")
    assert loaded.net.encoder_autocast == torch.bfloat16 and _linears(loaded.net)
    assert srupp_asr.load_model(model_dir, device="cpu", engine="torch").net.encoder_autocast is None
    autocasts: list[torch.dtype | str | None] = []
    load = LoadedModel.load.__func__

    def spy(cls, name_or_dir=None, device="auto", compute_type="float32", engine="auto"):
        model = load(cls, name_or_dir, device, compute_type, engine)
        # float32 on the CPU: the numpy runtime's network (no autocast) unless torch is asked for
        autocasts.append("numpy" if isinstance(model.net, NumpyASR) else model.net.encoder_autocast)
        return model

    monkeypatch.setattr(LoadedModel, "load", classmethod(spy))
    wav = write_tone(tmp_path / "tone.wav", 0.5)
    args = ["transcribe", str(wav), "--model", str(model_dir), "--no-lm", "-q", "-o", str(tmp_path / "out")]
    assert main([*args, "--compute-type", "bfloat16"]) == 0
    assert main(args) == 0
    assert main([*args, "--engine", "torch"]) == 0
    assert autocasts == [torch.bfloat16, "numpy", None]
    assert (tmp_path / "out" / "tone.txt").is_file()
