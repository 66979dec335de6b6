"""glibc malloc tuned for decoding: freed blocks are reused from the heap, not faulted in afresh."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from srupp_asr import allocator

# A growing cache and a second tensor, allocated and freed each step, as a beam search's key/value caches are.
STEPS = """
import resource, sys, torch
from srupp_asr.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(200):
    cache = torch.empty(256 * 1024 + step * 4096).fill_(1.0)
    other = torch.empty(128 * 1024 + step * 2048).fill_(2.0)
    del cache, other
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    default, kept = _page_faults("default"), _page_faults("keep")
    # About 1 MB of fresh pages a step by default (130 k faults); a few thousand once the heap keeps them.
    assert default > 50_000
    assert kept < default / 10


def test_nothing_is_changed_where_the_c_library_is_not_glibc(monkeypatch):
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("", ""))
    assert allocator.keep_freed_memory() is False


@pytest.mark.parametrize("command", ["transcribe", "evaluate"])
def test_the_decoding_commands_set_it(command, monkeypatch):
    import importlib

    module = importlib.import_module(
        {"transcribe": "srupp_asr.transcribe", "evaluate": "srupp_asr.scoring.evaluate"}[command]
    )
    calls = []
    monkeypatch.setattr(module, "keep_freed_memory", lambda: calls.append(command))

    class Stop(Exception):
        pass

    def stop(*_args, **_kwargs):
        raise Stop

    # Stop right after: what comes next (finding the inputs, evaluating) is tested elsewhere.
    monkeypatch.setattr(module, "find_inputs" if command == "transcribe" else "evaluate", stop)
    from srupp_asr.cli import build_parser

    argv = [command, "a.wav"] if command == "transcribe" else [command, "--model", "m", "--cuts", "c", "--out-dir", "o"]
    args = build_parser(command).parse_args(argv)
    with pytest.raises(Stop):
        args.func(args)
    assert calls == [command]
