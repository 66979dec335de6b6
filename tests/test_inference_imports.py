"""What inference imports: ``load_model()``, ``Model.transcribe``, ``srupp-asr transcribe`` and ``evaluate``'s decoding
load weights with torch alone, never the training stack (Lightning, which pulls in matplotlib and torch._dynamo:
seconds at every start), lhotse, nor the build tools of the CPU recurrence once it is built; and every command's
``--help`` imports none of them, torch included. Each check runs in a fresh interpreter: this test process has them
loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

from srupp_asr.cli import COMMANDS

pytestmark = pytest.mark.process  # fresh interpreters, each loading the built-in model

HEAVY = ("lightning", "pytorch_lightning", "matplotlib", "lhotse")
# torch.utils.cpp_extension imports setuptools (0.6 s): the CPU recurrence needs it to build, not to load its build
BUILD_TOOLS = ("setuptools", "pkg_resources")


def _loaded_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``heavy`` packages a fresh interpreter has imported after running ``code``."""
    report = f"\nimport sys\nprint('LOADED', *sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    out = subprocess.run(
        [sys.executable, "-c", code + report], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    return out.splitlines()[-1].split()[1:]


def test_loading_the_model_and_transcribing_import_no_lightning_matplotlib_lhotse_or_setuptools(tmp_path):
    wav = tmp_path / "tone.wav"
    code = f"""
import numpy as np, soundfile as sf
import srupp_asr
from srupp_asr.cli import main
sf.write({str(wav)!r}, 0.1 * np.sin(np.arange(8000) / 5.0), 16000)
model = srupp_asr.load_model(device="cpu")
model.transcribe(np.zeros(8000, np.float32), sample_rate=16000)
assert main(["transcribe", {str(wav)!r}, "--device", "cpu", "--decoding", "ctc_greedy"]) == 0
"""
    assert _loaded_after(code, heavy=(*HEAVY, *BUILD_TOOLS)) == []


def test_transcribing_on_the_cpu_with_the_defaults_imports_no_torch(tmp_path):
    """float32 on the CPU runs on the numpy runtime (srupp_asr.runtime): joint decoding with the LM, word times,
    the API and the command, and torch is never imported (it alone holds 0.49 GB)."""
    wav = tmp_path / "tone.wav"
    code = f"""
import numpy as np, soundfile as sf
import srupp_asr
from srupp_asr.cli import main
sf.write({str(wav)!r}, 0.1 * np.sin(np.arange(30000) / 5.0), 22050)
model = srupp_asr.load_model()
model.transcribe(0.1 * np.sin(np.arange(8000, dtype=np.float32) / 5.0), sample_rate=16000)
assert main(["transcribe", {str(wav)!r}, "-f", "all", "-o", {str(tmp_path)!r}]) == 0
"""
    assert _loaded_after(code, heavy=(*HEAVY, "torch", "torchaudio")) == []


def test_evaluate_decodes_without_lightning(tmp_path):
    """evaluate reads a lhotse manifest and draws plots (lhotse and matplotlib are its own), but its model loading
    and decoding are transcribe's: no Lightning."""
    code = f"""
import numpy as np, soundfile as sf
from lhotse import CutSet, Recording, SupervisionSegment
from srupp_asr.scoring.evaluate import evaluate
sf.write({str(tmp_path / "a.wav")!r}, np.zeros(8000, np.float32), 16000)
rec = Recording.from_file({str(tmp_path / "a.wav")!r}, recording_id="a")
cut = rec.to_cut()
cut.supervisions = [SupervisionSegment("a", "a", 0.0, rec.duration, text="yes")]
CutSet.from_cuts([cut]).to_file({str(tmp_path / "cuts.jsonl.gz")!r})
evaluate(None, {str(tmp_path / "cuts.jsonl.gz")!r}, {str(tmp_path / "out")!r}, decoding="ctc_greedy", device="cpu")
"""
    assert "lightning" not in _loaded_after(code)


# sclite keeps NIST sclite's own command line, where -h names the hypothesis file: it has no --help to check.
HELP_COMMANDS = sorted(set(COMMANDS) - {"sclite"})


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_help_imports_no_torch_lhotse_lightning_or_matplotlib(command):
    """``srupp-asr COMMAND --help`` builds its parser and prints without the heavy libraries (each costs seconds
    at start-up: torch alone 1-3 s on the 2-core machine)."""
    code = f"""
import contextlib, io
from srupp_asr.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main([{command!r}, "--help"])
    except SystemExit as done:
        assert done.code in (0, None), done.code
assert "usage: srupp-asr {command}" in out.getvalue(), out.getvalue()[:200]
"""
    assert _loaded_after(code, heavy=(*HEAVY, "torch")) == []
