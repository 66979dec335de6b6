"""benchmarks/search_ops.py: how it attributes operator calls, host syncs and kernel launches to the scorers of the
search, and one real run on the built-in model (the counts themselves are a benchmark's, run by hand)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.helpers import benchmark_module


@pytest.fixture(scope="module")
def so():
    with benchmark_module("search_ops") as module:
        yield module


def event(name, parent=None):
    return SimpleNamespace(name=name, cpu_parent=parent)


def test_calls_syncs_and_launches_go_to_the_enclosing_scorer(so):
    step = event(so.STEP_LABEL)
    linear = event("aten::linear", step)
    ctc = event("part CTC prefix: CTCPrefixScorer.score")
    item = event("aten::item", ctc)
    events = [
        step,
        linear,
        event("aten::unsqueeze", step),  # a view: a call, but no computing one
        event("aten::matmul", linear),  # inside another aten call: not counted again
        event("cudaLaunchKernel", event("aten::mm", linear)),
        ctc,
        item,
        event(so.SYNCS[0], item),
        event("aten::topk"),  # outside every scorer: the search's own
        event("tolist"),  # Tensor.tolist, labelled: a sync though no aten call on the CPU
    ]
    steps, parts = so.count(events)
    assert steps == 1
    assert dict(parts["decoder"]) == {"calls": 2, "compute": 1, "launches": 1}
    assert dict(parts["CTC prefix"]) == {"calls": 1, "compute": 1, "syncs": 1}
    assert dict(parts["search"]) == {"calls": 1, "compute": 1, "syncs": 1}
    rows = so.table(steps, parts, cuda=True)
    assert rows[2] == "| decoder | 2.0 | 1.0 | 0.0 | 1.0 | 33% |"
    assert rows[-1] == "| all | 4.0 | 3.0 | 2.0 | 1.0 | 100% |"


def test_the_scorers_methods_are_restored(so):
    from srupp_asr.decoding import scorers

    before, tolist = scorers.CTCPrefixScorer.score, torch.Tensor.tolist
    with so.instrumented():
        assert scorers.CTCPrefixScorer.score is not before and torch.Tensor.tolist is not tolist
        assert torch.tensor([1, 2]).tolist() == [1, 2]
    assert scorers.CTCPrefixScorer.score is before and torch.Tensor.tolist is tolist


@pytest.mark.process
def test_a_run_on_the_built_in_model_prints_a_row_per_part(so, capsys):
    from srupp_asr.decoding import scorers

    assert so.main(["--no-lm", "--beam", "2", "--ctc-recursion", "scan"]) == 0
    assert scorers.CTC_RECURSION == "auto"  # restored
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    rows = {line.split("|")[1].strip(): line for line in table}
    assert set(rows) == {"part", "decoder", "CTC prefix", "search", "all"}  # no LM row without the LM
    assert "no LM" in out and "CTC frames: scan" in out and " output steps" in out
    assert float(rows["all"].split("|")[2]) > float(rows["decoder"].split("|")[2]) > 0
