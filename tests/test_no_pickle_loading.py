"""No code path unpickles: every ``torch.load`` in the repository passes ``weights_only=True`` (a checkpoint or
state file from a stranger then cannot run code), and no library, benchmark or recipe code calls ``pickle.load``
(the tests may: one checks that a Tokenizer survives pickling for DataLoader workers)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("srupp_asr", "benchmarks", "recipes", "tests")


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            yield node, f"{node.func.value.id}.{node.func.attr}"


def test_every_torch_load_is_weights_only_and_nothing_unpickles():
    problems, loads = [], 0
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node, name in _calls(ast.parse(path.read_text(encoding="utf-8"))):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                if name == "torch.load":
                    loads += 1
                    flag = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
                    if not (isinstance(flag, ast.Constant) and flag.value is True):
                        problems.append(f"{where}: torch.load without weights_only=True")
                elif name in ("pickle.load", "pickle.loads", "dill.load", "joblib.load") and folder != "tests":
                    problems.append(f"{where}: {name}")
    assert loads >= 2  # the scan sees the checkpoint readers (checkpoints.load_checkpoint, train-lm --resume)
    assert not problems, "\n".join(problems)
