"""Checkpoint files (srupp_asr.checkpoints): written atomically, read with ``weights_only``; a full disk keeps
the previous one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from srupp_asr.checkpoints import PARTIAL_SUFFIX, load_checkpoint
from srupp_asr.errors import UserError
from srupp_asr.lightning_checkpoints import AtomicCheckpointIO
from tests.helpers import REPO

# ----------------------------------------------------------------------------------------------------
# moved from tests/test_reliability_training.py


def test_a_pickled_object_in_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": subprocess.Popen}, path)
    with pytest.raises(UserError, match=rf"^{path}: holds Python objects other than tensors and plain data"):
        AtomicCheckpointIO().load_checkpoint(path)


WRITE_UNDER_A_FILE_SIZE_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys, torch
    from srupp_asr.lightning_checkpoints import AtomicCheckpointIO
    from srupp_asr.errors import UserError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG, as with ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    try:
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(100_000)}}, sys.argv[1])
    except UserError as err:
        print(err)
    """
)


def test_a_full_disk_while_saving_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(10)}, "global_step": 7}, path)
    before = path.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", WRITE_UNDER_A_FILE_SIZE_LIMIT, str(path)], env=env, capture_output=True, text=True
    )
    assert out.stdout == f"{path}: cannot write the checkpoint (File too large); the previous one is kept\n", out.stderr
    assert path.read_bytes() == before
    assert load_checkpoint(path)["global_step"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the partial file was removed


def test_atomic_saves_fsync_and_never_show_a_partial_name_lightning_would_pick(tmp_path):
    io = AtomicCheckpointIO()
    (tmp_path / f".last.ckpt.stale{PARTIAL_SUFFIX}").write_bytes(b"half")
    io.save_checkpoint({"state_dict": {}, "global_step": 1}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    io.remove_checkpoint(tmp_path / "last.ckpt")
    io.remove_checkpoint(tmp_path / "last.ckpt")  # twice: already gone is fine
    assert not any(tmp_path.iterdir())
