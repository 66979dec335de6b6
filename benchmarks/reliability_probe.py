"""Re-run the failing cases of reliability issue 38 (damaged weights, unbounded reads, the table importer, out-of-range
options, writers) against the built-in model, each in a child process, and print a table: case -> outcome.

    python benchmarks/reliability_probe.py [--only SUBSTRING] [--keep DIR]
    python benchmarks/reliability_probe.py --beam-memory 10 128 256 1024

A case passes when the child ends within 60 s, exits as expected, prints no traceback, says what is expected (one
line naming the file or option), stays under 2 GiB of peak RSS (its own, from ``os.wait4``) and leaves its files as
expected. Exit status 1 when a case fails. Built-in model only: nothing is downloaded.

``--beam-memory`` instead measures what the beam bound (``decoding.options.MAX_BEAM``) is tied to: the peak RSS of
``transcribe --decoding ctc_prefix_beam --beam N`` (the built-in model with its LM, the mode whose memory grows most
with the beam) on 30 s of noise, one child per beam, the bound lifted in the child so that beams past it are measured.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "srupp_asr" / "default_model"
TIMEOUT_S = 60
MAX_RSS_MIB = 2048
GB = 2**30


@dataclass
class Case:
    """One probe: ``setup(folder)`` makes the inputs and returns the child's argv after ``python``; the child must
    exit with ``status`` and print ``says`` (stderr or stdout); ``check(folder)`` tests what it left."""

    name: str
    setup: Callable[[Path], list[str]]
    says: str
    status: int = 2
    check: Callable[[Path], bool] | None = None
    limits: dict[int, int] = field(default_factory=dict)  # resource limits of the child


def cli(*args: str) -> list[str]:
    return ["-m", "srupp_asr.cli", *args]


def api(code: str) -> list[str]:
    """A Python API call in a child: a UserError (the API's one-line error) is printed and exits 1."""
    head = "import sys, srupp_asr, srupp_asr.errors, numpy as np\n"
    return ["-c", f"{head}try:\n    {code}\nexcept srupp_asr.errors.UserError as err:\n    sys.exit(str(err))\n"]


def noise(path: Path, seconds: float = 2.0, rate: int = 16000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    samples = 0.05 * np.random.default_rng(0).standard_normal(int(seconds * rate)).astype(np.float32)
    sf.write(path, samples, rate)
    return path


def model_copy(folder: Path) -> Path:
    """A copy of the built-in model (with its lm/) to damage."""
    return Path(shutil.copytree(DEFAULT_MODEL, folder / "model"))


def damage_weight(weights: Path, key: str, index, value: float) -> None:
    tensors = load_file(weights)
    tensors[key][index] = value
    save_file(tensors, weights, metadata={"format_version": "1"})


def transcribe(folder: Path, model: Path, *more: str) -> list[str]:
    return cli("transcribe", "--device", "cpu", "--model", str(model), *more, str(noise(folder / "a.wav")))


# ------------------------------------------------------------------------------------------ the cases


def nan_ctc(folder: Path) -> list[str]:
    model = model_copy(folder)
    damage_weight(model / "model-00002-of-00003.safetensors", "ctc.weight", (5, 7), math.nan)
    return transcribe(folder, model)


def nan_ctc_evaluate(folder: Path) -> list[str]:
    args = nan_ctc(folder)
    table(folder, "path,text\na.wav,hello\n")
    prepare_cmd = [sys.executable, *cli("prepare", "table", str(folder / "t.csv"), str(folder / "cuts"))]
    subprocess.run(prepare_cmd, check=True, capture_output=True)
    return cli(
        "evaluate",
        "--device",
        "cpu",
        "--model",
        args[args.index("--model") + 1],
        "--cuts",
        str(folder / "cuts" / "all_cuts.jsonl.gz"),
        "--out-dir",
        str(folder / "eval"),
    )


def lm_damage(key: str, index, value: float) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        model = model_copy(folder)
        damage_weight(model / "lm" / "model.safetensors", key, index, value)
        return transcribe(folder, model)

    return setup


def fusion_weight(value: str) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        model = model_copy(folder)
        config = model / "lm" / "config.yaml"
        lines = [line for line in config.read_text().splitlines() if not line.startswith("fusion_weight")]
        config.write_text("\n".join([*lines, f"fusion_weight: {value}", ""]))
        return transcribe(folder, model)

    return setup


def replaced(name: str, kind: str) -> Callable[[Path], list[str]]:
    """The model copy's file ``name`` replaced by a link to /dev/zero, a named pipe or an 8 GB sparse file."""

    def setup(folder: Path) -> list[str]:
        model = model_copy(folder)
        path = model / name
        path.unlink()
        if kind == "zero":
            path.symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            with open(path, "wb") as f:
                f.truncate(8 * GB)
        return transcribe(folder, model)

    return setup


def crafted_checkpoint(**changes) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        net = torch.nn.Linear(2, 2)
        state = {f"model.{k}": v for k, v in net.state_dict().items()}
        base = {"state_dict": state, "hyper_parameters": {"tokenizer": "tok.model"}, "global_step": 1}
        torch.save(base, folder / "a.ckpt")
        crafted = {**base, "state_dict": {**state, "model.extra": 7}} if changes.pop("state_int", 0) else {}
        crafted = crafted or {**base, **changes}
        torch.save(crafted, folder / "b.ckpt")
        tok = DEFAULT_MODEL / "tokenizer.model"
        return cli(
            "average",
            "--ckpts",
            str(folder / "a.ckpt"),
            str(folder / "b.ckpt"),
            "--tokenizer",
            str(tok),
            "--out",
            str(folder / "out"),
        )

    return setup


def table(folder: Path, text: str, name: str = "t.csv") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return path


def prepare(text: str, *more: str, make: Callable[[Path], None] | None = None) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        noise(folder / "corpus" / "a.wav")
        noise(folder / "corpus" / "b.wav")
        noise(folder / "x.wav")
        if make is not None:
            make(folder)
        return cli("prepare", "table", str(table(folder / "corpus", text)), str(folder / "out"), *more)

    return setup


def manifest_text(folder: Path) -> str:
    import gzip
    import json

    with gzip.open(folder / "out" / "all_cuts.jsonl.gz", "rt") as f:
        return json.dumps([json.loads(line)["supervisions"][0]["text"] for line in f])


def full_disk_all_formats(folder: Path) -> list[str]:
    out = folder / "out"
    out.mkdir()
    for fmt in ("txt", "vtt", "srt", "tsv", "json"):
        (out / f"a.{fmt}").write_text(f"previous {fmt}\n")
    return cli(
        "transcribe",
        "--device",
        "cpu",
        "--decoding",
        "ctc_greedy",
        "-f",
        "all",
        "-o",
        str(out),
        str(noise(folder / "a.wav", 30.0)),
    )


def previous_outputs_kept(folder: Path) -> bool:
    return all(p.read_text() == f"previous {p.suffix[1:]}\n" for p in (folder / "out").iterdir())


def read_only_output(folder: Path) -> list[str]:
    out = folder / "out"
    out.mkdir()
    subprocess.run(["chattr", "+i", str(out)], check=True)  # root writes into a mode-555 folder
    return cli("transcribe", "--device", "cpu", "-o", str(out), str(noise(folder / "a.wav")))


def changed_audio(folder: Path) -> list[str]:
    noise(folder / "a.wav", 2.0)
    table(folder, "path,text\na.wav,hello\n")
    prepare_cmd = [sys.executable, *cli("prepare", "table", str(folder / "t.csv"), str(folder / "cuts"))]
    subprocess.run(prepare_cmd, check=True, capture_output=True)
    noise(folder / "a.wav", 1.0)
    return cli(
        "evaluate",
        "--device",
        "cpu",
        "--cuts",
        str(folder / "cuts" / "all_cuts.jsonl.gz"),
        "--out-dir",
        str(folder / "eval"),
    )


def lm_as(kind: str) -> Callable[[Path], list[str]]:
    def setup(folder: Path) -> list[str]:
        model = model_copy(folder)
        if kind == "file":
            shutil.rmtree(model / "lm")
            (model / "lm").write_text("not a folder\n")
        else:
            (model / "lm" / "config.yaml").unlink()
            os.mkfifo(model / "lm" / "config.yaml")
        return transcribe(folder, model)

    return setup


def pickled_checkpoint(folder: Path) -> list[str]:
    torch.save({"state_dict": {}, "payload": os.system}, folder / "evil.ckpt")
    return cli(
        "average",
        "--ckpts",
        str(folder / "evil.ckpt"),
        "--tokenizer",
        str(DEFAULT_MODEL / "tokenizer.model"),
        "--out",
        str(folder / "out"),
    )


def decoding_oom(folder: Path) -> list[str]:
    # 10 minutes decoded whole with a beam of 128 and the LM: more than the 4.5 GB address space allowed.
    return cli(
        "transcribe",
        "--device",
        "cpu",
        "--decoding",
        "ctc_prefix_beam",
        "--beam",
        "128",
        "--max-chunk-seconds",
        "600",
        str(noise(folder / "long.wav", 600.0)),
    )


def junk_audio(folder: Path) -> None:
    (folder / "corpus" / "junk.wav").write_bytes(b"x" * 99)


def symlink_pair(folder: Path) -> None:
    (folder / "corpus" / "alias.wav").symlink_to(folder / "corpus" / "a.wav")


def special_files(folder: Path) -> None:
    os.mkfifo(folder / "corpus" / "pipe.wav")
    (folder / "corpus" / "zero.wav").symlink_to("/dev/zero")
    (folder / "corpus" / "dir.wav").mkdir()


OUTSIDE = "is outside the table's folder"
NOT_REGULAR = "is not a regular file"
CASES = [
    Case(
        "table: quoted multi-line field (LF)",
        prepare('path,text\na.wav,"hello\nworld"\n'),
        "wrote 1 cuts",
        0,
        lambda d: manifest_text(d) == '["hello\\nworld"]',
    ),
    Case(
        "table: quoted multi-line field (CRLF)",
        prepare('path,text\r\na.wav,"hello\r\nworld"\r\n'),
        "wrote 1 cuts",
        0,
        lambda d: manifest_text(d) == '["hello\\r\\nworld"]',
    ),
    Case("ASR model: NaN in ctc.weight (transcribe)", nan_ctc, "weight ctc.weight holds 1 NaN or infinite value"),
    Case("ASR model: NaN in ctc.weight (evaluate)", nan_ctc_evaluate, "weight ctc.weight holds 1 NaN"),
    Case("LM: NaN weights", lm_damage("norm.weight", 0, math.nan), "weight norm.weight holds 1 NaN"),
    Case("LM: +inf in out.bias", lm_damage("out.bias", 3, math.inf), "weight out.bias holds 1 NaN or infinite"),
    Case(
        "LM: +inf in the <sos/eos> embedding row",
        lm_damage("embed.weight", (2, 0), math.inf),
        "weight embed.weight holds 1 NaN or infinite",
    ),
    Case("lm/config.yaml fusion_weight: 1.0e+300", fusion_weight("1.0e+300"), "fusion_weight must be a number in"),
    Case(
        "--lm-weight 3.4e38",
        lambda d: transcribe(d, DEFAULT_MODEL, "--lm-weight", "3.4e38"),
        "lm_weight must be a number in [0, 1000], got 3.4e+38",
    ),
    Case(
        "--lm-weight 1e300",
        lambda d: transcribe(d, DEFAULT_MODEL, "--lm-weight", "1e300"),
        "lm_weight must be a number in [0, 1000]",
    ),
    Case("config.yaml -> /dev/zero", replaced("config.yaml", "zero"), f"config.yaml: model config {NOT_REGULAR}"),
    Case("index.json -> /dev/zero", replaced("model.safetensors.index.json", "zero"), f"weights index {NOT_REGULAR}"),
    Case("lm/config.yaml sparse 8 GB", replaced("lm/config.yaml", "sparse"), "LM config holds more than 4 MiB"),
    Case("config.yaml a FIFO", replaced("config.yaml", "fifo"), "model config is not a regular file (a pipe"),
    Case("index.json a FIFO", replaced("model.safetensors.index.json", "fifo"), "weights index is not a regular file"),
    Case("--beam 100000", lambda d: transcribe(d, DEFAULT_MODEL, "--beam", "100000"), "beam must be an integer in"),
    Case(
        "--beam 1000000000",
        lambda d: transcribe(d, DEFAULT_MODEL, "--beam", "1000000000"),
        "beam must be an integer in [1, 128]",
    ),
    Case(
        "API beam=10**9",
        lambda d: api(
            f"srupp_asr.load_model(device='cpu').transcribe('{noise(d / 'a.wav')}', decoding='joint', beam=10**9)"
        ),
        "beam must be an integer in",
        1,
    ),
    Case(
        "API sample_rate=10**12",
        lambda d: api("srupp_asr.load_model(device='cpu').transcribe(np.zeros(16000, np.float32), sample_rate=10**12)"),
        "sample_rate 1000000000000 Hz is outside 1000-1000000 Hz",
        1,
    ),
    Case(
        "average: hyper_parameters=[1, 2]",
        crafted_checkpoint(hyper_parameters=[1, 2]),
        "hyper_parameters is a list, not a mapping",
    ),
    Case("average: global_step='abc'", crafted_checkpoint(global_step="abc"), "global_step is 'abc', not a whole"),
    Case("average: global_step=NaN", crafted_checkpoint(global_step=math.nan), "global_step is nan, not a whole"),
    Case(
        "average: an int in the state_dict",
        crafted_checkpoint(state_int=True),
        "state_dict entry 'model.extra' is int, not a tensor",
    ),
    Case("table: ../../../../etc/passwd", prepare("path,text\n../../../../etc/passwd,a\na.wav,b\n"), OUTSIDE, 1),
    Case("table: ../x.wav", prepare("path,text\n../x.wav,a\na.wav,b\n"), OUTSIDE, 1),
    Case("table: an absolute path", prepare("path,text\n/etc/passwd,a\na.wav,b\n"), OUTSIDE, 1),
    Case("audiofolder metadata.csv: ../../", lambda d: cli("prepare", "table", str(d / "af"), str(d / "out")), OUTSIDE),
    Case(
        "start-up under ulimit -v 3.3 GB",
        lambda d: transcribe(d, DEFAULT_MODEL),
        "out of memory while running transcribe",
        1,
        limits={resource.RLIMIT_AS: int(3.3e9)},
    ),
    Case(
        "out of memory while decoding",
        decoding_oom,
        "out of memory while decoding",
        1,
        limits={resource.RLIMIT_AS: int(4.5 * GB)},
    ),
    Case(
        "table: a link and its target",
        prepare("path,text\na.wav,one\nalias.wav,two\n", make=symlink_pair),
        "is listed again, the same file as",
        1,
    ),
    Case("table: a FIFO", prepare("path,text\npipe.wav,a\na.wav,b\n", make=special_files), "(a pipe;", 1),
    Case(
        "table: a link to /dev/zero",
        prepare("path,text\nzero.wav,a\na.wav,b\n", "--audio-roots", "/dev", make=special_files),
        "(a device;",
        1,
    ),
    Case("table: a folder", prepare("path,text\ndir.wav,a\na.wav,b\n", make=special_files), "is a directory", 1),
    Case(
        "table: audio that does not decode",
        prepare("path,text\njunk.wav,a\na.wav,b\n", make=junk_audio),
        "Format not recognised",
        1,
    ),
    Case("table: a URL", prepare("path,text\nhttps://example.com/a.wav,a\na.wav,b\n"), "is a URL", 1),
    Case(
        "table: an unterminated quote",
        prepare('path,text\na.wav,"open\nb.wav,fine\n'),
        "t.csv:2: a quote opened in this row is never closed",
        1,
    ),
    Case("table: NUL in a transcript", prepare("path,text\na.wav,he\0llo\nb.wav,b\n"), "holds a NUL character", 1),
    Case(
        "full disk: -f all keeps every previous output",
        full_disk_all_formats,
        "no file of the set was changed",
        1,
        previous_outputs_kept,
        limits={resource.RLIMIT_FSIZE: 200},
    ),
    Case("read-only existing output folder", read_only_output, "cannot write to the output folder"),
    Case(
        "evaluate: audio changed since its manifest",
        changed_audio,
        "its audio changed after the manifest was written",
        1,
    ),
    Case("lm as a plain file", lm_as("file"), "lm: not a directory"),
    Case("lm/config.yaml a FIFO", lm_as("fifo"), "LM config is not a regular file (a pipe"),
    Case("a pickled checkpoint", pickled_checkpoint, "holds Python objects other than tensors"),
]


def audiofolder(folder: Path) -> None:
    noise(folder / "secret.wav")
    (folder / "af" / "sub").mkdir(parents=True)
    noise(folder / "af" / "sub" / "a.wav")
    table(folder / "af" / "sub", "file_name,transcription\n../../secret.wav,a\n", "metadata.csv")


def run_case(case: Case, folder: Path) -> tuple[str, float, float, str]:
    """(outcome, wall s, peak RSS MiB, what went wrong)."""
    if case.name.startswith("audiofolder"):
        audiofolder(folder)
    argv = [sys.executable, *case.setup(folder)]

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        for which, value in case.limits.items():
            resource.setrlimit(which, (value, value))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        child = subprocess.Popen(argv, cwd=folder, stdout=out, stderr=err, preexec_fn=limit, env=env)
        deadline = start + TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                return "FAIL", time.monotonic() - start, usage.ru_maxrss / 1024, "hung (killed at 60 s)"
            time.sleep(0.05)
    wall, rss = time.monotonic() - start, usage.ru_maxrss / 1024
    code = os.waitstatus_to_exitcode(status)
    text = (folder / "stderr").read_text(errors="replace") + (folder / "stdout").read_text(errors="replace")
    problems = []
    if "Traceback" in text:
        problems.append("traceback")
    if code != case.status:
        problems.append(f"exit {code}, expected {case.status}")
    if case.says not in text:
        problems.append(f"does not say {case.says!r}")
    if rss > MAX_RSS_MIB and not case.limits:
        problems.append(f"peak RSS {rss:.0f} MiB")
    if case.check is not None and not case.check(folder):
        problems.append("left the wrong files")
    last = next((line for line in reversed(text.splitlines()) if case.says in line), text.strip()[-150:])
    return ("pass" if not problems else "FAIL"), wall, rss, "; ".join(problems) or last


# The bound lifted in the measuring child only, so that beams past it can be measured.
UNBOUNDED_BEAM = (
    "import sys\nimport srupp_asr.decoding.options as o\no.MAX_BEAM = 10**9\nfrom srupp_asr.cli import main\n"
)


def beam_memory(beams: list[int]) -> int:
    """Print the peak RSS of ctc_prefix_beam decoding (with the built-in LM) of 30 s of noise per beam."""
    folder = Path(tempfile.mkdtemp(prefix="beam-"))
    audio = noise(folder / "noise30.wav", 30.0)
    print("| beam | exit | wall s | peak RSS MiB |\n|---|---|---|---|")
    for beam in beams:
        args = ["transcribe", "--device", "cpu", "--decoding", "ctc_prefix_beam", "--beam", str(beam), str(audio)]
        argv = [sys.executable, "-c", f"{UNBOUNDED_BEAM}sys.exit(main({args!r}))"]
        start = time.monotonic()
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - start
        print(
            f"| {beam} | {os.waitstatus_to_exitcode(status)} | {wall:.1f} | {usage.ru_maxrss / 1024:.0f} |", flush=True
        )
    shutil.rmtree(folder, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the cases whose name holds this")
    parser.add_argument("--keep", type=Path, help="keep each case's folder under this")
    parser.add_argument("--beam-memory", type=int, nargs="+", metavar="BEAM", help="measure decoding memory instead")
    args = parser.parse_args()
    if args.beam_memory:
        return beam_memory(args.beam_memory)
    cases = [c for c in CASES if args.only is None or args.only in c.name]
    root = Path(tempfile.mkdtemp(prefix="probe-")) if args.keep is None else args.keep
    print("| case | outcome | exit wall s | peak RSS MiB | what it said / what went wrong |")
    print("|---|---|---|---|---|")
    failed = 0
    for i, case in enumerate(cases):
        folder = root / f"{i:02d}"
        folder.mkdir(parents=True)
        try:
            outcome, wall, rss, said = run_case(case, folder)
        finally:
            subprocess.run(["chattr", "-R", "-i", str(folder)], capture_output=True, check=False)
        failed += outcome != "pass"
        said = said.replace("|", "\\|").replace(str(folder), "DIR")
        print(f"| {case.name} | {outcome} | {wall:.1f} | {rss:.0f} | {said[:160]} |", flush=True)
    print(f"\n{len(cases) - failed} of {len(cases)} cases pass")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
