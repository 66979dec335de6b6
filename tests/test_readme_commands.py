"""The commands the documentation shows exist as written: every ``srupp-asr`` command, recipe and benchmark
option in a shell block of the README, docs/*.md, the recipes' READMEs and RESULTS files, benchmarks/RESULTS.md and
RELIABILITY.md is one the program accepts. A renamed or removed option then fails here, not in a reader's shell.

Only the names are checked (sub-commands and ``--options``), not the values: the examples use placeholders.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from srupp_asr.cli import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "RELIABILITY.md",
        *REPO.glob("docs/*.md"),
        REPO / "benchmarks" / "RESULTS.md",
        *REPO.glob("recipes/*/README.md"),
        *REPO.glob("recipes/*/RESULTS.md"),
    ]
)
SHELLS = {"", "bash", "sh", "shell", "console"}  # fence languages of shell blocks


def shell_blocks(text: str) -> list[str]:
    """The contents of the fenced blocks of markdown ``text`` whose language is a shell (or unnamed)."""
    blocks, language, lines = [], None, []
    for line in text.splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            if language is None:
                language, lines = fence[3:].strip(), []
            else:
                if language in SHELLS:
                    blocks.append("\n".join(lines))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def shell_lines(text: str) -> list[str]:
    """The logical lines of the shell blocks in markdown ``text`` (continuations joined, comments dropped)."""
    lines = []
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # an unbalanced quote in a prose-like example: not a command to check
                continue
            if words:
                lines.append(words)
    return lines


def commands(doc: Path) -> list[tuple[str, list[str]]]:
    """``(program, words after it)`` of every srupp-asr, recipe or benchmark invocation in ``doc``."""
    found = []
    for words in shell_lines(doc.read_text(encoding="utf-8")):
        for i, word in enumerate(words):
            name = Path(word).name
            if name == "srupp-asr" or re.fullmatch(r"(recipes/\w+/run\.sh|benchmarks/\w+\.py)", word):
                rest = []
                for w in words[i + 1 :]:
                    if w in {"|", "&&", ";", "||", ">", "2>&1"}:
                        break
                    rest.append(w)
                found.append(("srupp-asr" if name == "srupp-asr" else word, rest))
                break
    return found


def option_names(words: list[str]) -> list[str]:
    """The ``--options`` among ``words`` (``--a.b=value`` -> ``--a.b``); ``-h`` style short options too."""
    return [w.split("=", 1)[0] for w in words if re.fullmatch(r"--?[A-Za-z][\w.-]*(=.*)?", w)]


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_srupp_asr(words: list[str]) -> list[str]:
    """Problems with ``srupp-asr WORDS``: an unknown command, sub-command or option."""
    if not words or words[0].startswith("-"):
        unknown = [o for o in option_names(words) if o not in {"--help", "-h", "--version"}]
        return [f"srupp-asr: unknown option {o}" for o in unknown]
    command = words[0]
    if command not in COMMANDS:
        return [f"srupp-asr: no command {command!r}"]
    if command == "train":
        return check_train(words[1:])
    if command == "sclite":  # NIST sclite's own single-dash command line, parsed by its own reader
        from srupp_asr.errors import UserError
        from srupp_asr.scoring.sclite import parse_args

        try:
            parse_args(words[1:])
        except UserError as err:
            return [f"srupp-asr sclite: {err}"]
        return []
    parser = subparsers_of(build_parser(command))[command]
    rest = words[1:]
    while (subs := subparsers_of(parser)) and rest and not rest[0].startswith("-"):
        if rest[0] not in subs:
            return [f"srupp-asr {command}: no sub-command {rest[0]!r}"]
        parser, rest = subs[rest[0]], rest[1:]
    known = set(parser._option_string_actions)
    return [f"srupp-asr {command}: unknown option {o}" for o in option_names(rest) if o not in known]


@functools.cache
def help_text(*argv: str) -> str:
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(argv)} failed: {proc.stderr[-2000:]}"
    return proc.stdout


def check_train(words: list[str]) -> list[str]:
    """LightningCLI's options (``--trainer.max_steps``, ``--model.init_from``, ...), from ``train fit --help``."""
    text = help_text(sys.executable, "-m", "srupp_asr.cli", "train", "fit", "--help")
    listed = set(re.findall(r"(--[\w.+-]+)", text))
    options = [o.rstrip("+") for o in option_names(words)]  # --trainer.callbacks+=...
    return [f"srupp-asr train: unknown option {o}" for o in options if o not in listed]


def check_script(script: str, words: list[str]) -> list[str]:
    """A recipe's or benchmark's options, from its ``--help``."""
    if not (REPO / script).is_file():
        return [f"{script}: no such script"]
    argv = ("bash", script, "--help") if script.endswith(".sh") else (sys.executable, script, "--help")
    listed = set(re.findall(r"(--[\w-]+)", help_text(*argv)))
    return [f"{script}: unknown option {o}" for o in option_names(words) if o not in listed and o != "--help"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_and_option_exists(doc):
    found = commands(doc)
    problems = [
        problem
        for program, words in found
        for problem in (check_srupp_asr(words) if program == "srupp-asr" else check_script(program, words))
    ]
    assert not problems, f"{doc.relative_to(REPO)}:\n" + "\n".join(dict.fromkeys(problems))


def test_the_docs_show_every_command():
    """Each sub-command appears in an example of the README or docs/, and the checker finds them (it cannot pass
    vacuously); the README itself shows the first steps: transcribe, and the pipeline of training on one's own data."""
    shown = {
        words[0]
        for doc in [REPO / "README.md", *REPO.glob("docs/*.md")]
        for program, words in commands(doc)
        if program == "srupp-asr" and words
    }
    assert set(COMMANDS) <= shown, f"not shown in a shell block of the README or docs/: {sorted(set(COMMANDS) - shown)}"
    in_readme = {words[0] for program, words in commands(REPO / "README.md") if program == "srupp-asr" and words}
    first_steps = {"transcribe", "prepare", "tokenizer", "cmvn", "train", "average", "evaluate"}
    assert first_steps <= in_readme, f"not in the README: {sorted(first_steps - in_readme)}"


def test_the_readme_is_short_and_its_links_resolve():
    """The README stays a front door (<= 200 lines); every relative link of the README and docs/ names a file that
    exists, and every #anchor a heading of that file (GitHub's slugs)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    problems = []
    for doc in [REPO / "README.md", *REPO.glob("docs/*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                problems.append(f"{doc.name}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in heading_slugs(file):
                problems.append(f"{doc.name}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def heading_slugs(doc: Path) -> set[str]:
    """GitHub's anchors of the headings of markdown ``doc`` (lower case, punctuation dropped, spaces as '-')."""
    slugs = set()
    fence = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#+ (.*)", line)):
            slugs.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return slugs


def test_the_checker_catches_a_misspelt_option_command_and_script():
    assert check_srupp_asr(["transcribe", "a.wav", "--beam-size", "5"]) == [
        "srupp-asr transcribe: unknown option --beam-size"
    ]
    assert check_srupp_asr(["transcribe", "a.wav", "--beam", "5", "-f", "srt"]) == []
    assert check_srupp_asr(["decode", "x"]) == ["srupp-asr: no command 'decode'"]
    assert check_srupp_asr(["corpus", "prepare", "--no-such"]) == ["srupp-asr corpus: unknown option --no-such"]
    assert check_script("benchmarks/nothing.py", []) == ["benchmarks/nothing.py: no such script"]


def test_the_readme_puts_srupp_asr_on_the_path_before_its_first_command_and_spells_it_one_way():
    # After `make setup` srupp-asr lives in .venv/bin: a bare `srupp-asr` works only once the venv is activated.
    text = (REPO / "README.md").read_text(encoding="utf-8")
    spellings = {word for words in shell_lines(text) for word in words if Path(word).name == "srupp-asr"}
    assert spellings == {"srupp-asr"}
    first_command = re.search(r"^srupp-asr ", text, flags=re.MULTILINE)
    assert first_command is not None and text.index("source .venv/bin/activate") < first_command.start()
