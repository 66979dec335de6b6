"""Bad inputs to ``srupp-asr average``: each is one line naming the file or option, and none is taken for a
result (a checkpoint is not averaged twice). The other commands' bad inputs moved to the tests of their modules
(``test_corpora.py``: ``corpus score-talks`` and ``speed-perturb``; ``test_synth.py``: ``synth-corpus --text``;
``test_summary.py``: ``summarize --sets``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from srupp_asr.average import average_checkpoints
from srupp_asr.cli import main
from srupp_asr.errors import UserError
from tests.helpers import one_line_error, seeded_model, write_checkpoint

# ---- corpus score-talks and speed-perturb --------------------------------------------------------------------


# ---- synth-corpus --text ---------------------------------------------------------------------------------------


# ---- summarize --sets ------------------------------------------------------------------------------------------


# ---- average ---------------------------------------------------------------------------------------------------


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
