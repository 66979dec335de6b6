"""Configs by name: ``--config tiny_cpu`` (or ``tiny_cpu.yaml``, ``conf/tiny_cpu.yaml``, a path) works from any
directory, the configs ship as package data, and an error in a command-line override names the override."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from srupp_asr import configs
from srupp_asr.cli import main
from srupp_asr.configs import config_names, resolve_config, resolve_config_args
from srupp_asr.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def test_every_config_of_conf_is_shipped_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout: conf/ is not here
    names = sorted(p.stem for p in (REPO / "conf").glob("*.yaml"))
    assert config_names() == names and "tiny_cpu" in names
    for spelling in ("tiny_cpu", "tiny_cpu.yaml", "conf/tiny_cpu.yaml"):
        assert Path(resolve_config(spelling)).read_bytes() == (REPO / "conf" / "tiny_cpu.yaml").read_bytes()
    conf = REPO / "conf"
    assert resolve_config_args(["fit", "--config", "tiny_cpu", "-c=x", "--config=train_srupp"]) == [
        "fit", "--config", str(conf / "tiny_cpu.yaml"), "-c=x", "--config=" + str(conf / "train_srupp.yaml")
    ]  # fmt: skip


def test_a_file_at_the_path_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny_cpu").write_text("model: {}\n")
    assert resolve_config("tiny_cpu") == "tiny_cpu"
    (tmp_path / "mine.yaml").write_text("model: {}\n")
    assert resolve_config("mine.yaml") == "mine.yaml"


def test_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^tiny_cpux: config file not found, and no shipped config of that name "
                       r"\(shipped: .*tiny_cpu, train_blstm"):  # fmt: skip
        resolve_config("tiny_cpux")
    with pytest.raises(UserError, match="config file not found"):  # a folder other than conf/ is a path, not a name
        resolve_config("elsewhere/tiny_cpu.yaml")


def test_an_installed_wheel_reads_the_package_copy(tmp_path, monkeypatch):
    """In a wheel the configs lie in srupp_asr/conf (setup.cfg's package data), beside the modules."""
    package = tmp_path / "site-packages" / "srupp_asr"
    (package / "conf").mkdir(parents=True)
    (package / "conf" / "tiny_cpu.yaml").write_text("seed_everything: 1\n")
    monkeypatch.setattr(configs, "_PACKAGE", package)
    monkeypatch.chdir(tmp_path)
    assert resolve_config("tiny_cpu") == str(package / "conf" / "tiny_cpu.yaml")
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert "srupp_asr.conf" in setup["options"]["packages"].split()
    assert "srupp_asr.conf = conf" in setup["options"]["package_dir"]
    assert setup["options.package_data"]["srupp_asr.conf"].strip() == "*.yaml"


def test_torch_and_torchaudio_are_pinned_to_one_release_and_installed_so():
    """setup.cfg pins torch and torchaudio to the same exact release, and that is what is installed: a
    ``torchaudio==2.11.*`` pin once gave a fresh clone torchaudio 2.11.1 beside torch 2.11.0, which cannot load."""
    import torch
    import torchaudio

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    pins = dict(
        line.split("==") for line in setup["options"]["install_requires"].split("\n") if line.startswith("torch")
    )
    assert set(pins) == {"torch", "torchaudio"}
    assert pins["torch"] == pins["torchaudio"] and "*" not in pins["torch"]
    assert torch.__version__.split("+")[0] == torchaudio.__version__.split("+")[0] == pins["torch"]


def _train(capsys, *argv: str) -> tuple[int, str]:
    """``srupp-asr train fit ARGV`` in this process: (exit status, the last line of stderr)."""
    code = main(["train", "fit", *argv])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_from_another_directory_a_misspelt_override_names_the_override(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # named configs resolve from anywhere
    assert _train(capsys, "--config", "tiny_cpu", "--model.lrr", "0.1") == (
        2,
        "srupp-asr train: error: command line: unknown option --model.lrr (did you mean --model.lr?)",
    )
    # a bad key inside a config file still names that file
    (tmp_path / "bad.yaml").write_text("model:\n  lrr: 0.1\n")
    code, last = _train(capsys, "--config", "tiny_cpu", "--config", "bad.yaml")
    assert code == 2 and "bad.yaml" in last, last


def test_every_shipped_decoding_config_reads_as_its_yaml():
    import yaml

    for path in sorted((REPO / "conf").glob("decode_*.yaml")):
        assert configs.read_decode_config(path) == yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("beam: 10\nctc-weight: 0.3\nlength_penalty: 0\nlm_weight: 0.5\n", "unknown key 'ctc-weight'"),
        ("beam: 10\nctc_weight: 0.3\nlength_penalty: 0\n", "no lm_weight"),
        ("beam: 10\nctc_weight: 1.5\nlength_penalty: 0\nlm_weight: 0.5\n", "ctc_weight must be in [0, 1]"),
        ("beam: ten\nctc_weight: 0.3\nlength_penalty: 0\nlm_weight: 0.5\n", "beam must be an integer"),
    ],
)
def test_a_decoding_config_with_a_wrong_key_or_value_is_one_line_naming_it(tmp_path, capsys, text, problem):
    path = tmp_path / "decode.yaml"
    path.write_text(text)
    assert configs.main(["decode", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and problem in err


def test_the_recipes_decoding_options_come_from_the_config_read_by_python(tmp_path):
    # decode_options of recipes/common/stages.sh, as a corpus recipe calls it, on a flow mapping: YAML that a
    # line-wise sed read as no values at all.
    config = tmp_path / "decode.yaml"
    config.write_text("{beam: 7, ctc_weight: 0.25, length_penalty: 0.5, lm_weight: 0.4}  # narrow\n")
    script = (
        f"source {REPO}/recipes/common/stages.sh; py={sys.executable}; decode_config={config}; use_lm=true; "
        'lm_dir=LM; beam=; ctc_weight=0.1; lm_weight=; decode_options joint; echo "${decode_args[*]}"'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split() == [
        "--decoding", "joint", "--beam", "7", "--ctc-weight", "0.1", "--length-penalty", "0.5",
        "--lm", "LM", "--lm-weight", "0.4",
    ]  # fmt: skip
