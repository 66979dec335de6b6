"""Fixtures of the process-level tests: the augmented training config and the uninterrupted run that the stopped
and resumed runs of ``test_training_stops.py`` and ``test_resume_matrix.py`` must end like."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import Corpus, built_once
from tests.process.runs import TOTAL_STEPS, augmented_config, load_weights, run_args, srupp_asr_train


@pytest.fixture(scope="session")
def overrides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config over conf/tiny_cpu.yaml with dropout and SpecAugment on (a resume must restore the generators)."""
    return augmented_config(tmp_path_factory.mktemp("config") / "augmented.yaml", speed_perturb=False)


@pytest.fixture(scope="session")
def straight(corpus: Corpus, overrides: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run of TOTAL_STEPS steps (built once per test run)."""

    def build(folder: Path) -> None:
        srupp_asr_train(run_args(corpus, folder / "exp", folder / "weights", overrides, TOTAL_STEPS))

    return load_weights(built_once(tmp_path_factory, "straight", build) / "weights" / "rank0.pt")
