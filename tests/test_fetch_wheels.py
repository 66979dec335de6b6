"""recipes/synth_en/local/fetch_wheels.py: which wheels a GPU lease carries. The choice is tested on made-up
resolutions (no registry needed); the download itself is pip's."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "recipes" / "synth_en" / "local" / "fetch_wheels.py"


@pytest.fixture(scope="module")
def fw():
    spec = importlib.util.spec_from_file_location("fetch_wheels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


def test_the_project_requirements_leave_torch_and_pyav_out(fw):
    requirements = fw.project_requirements(REPO / "setup.cfg", fw.LEFT_OUT)
    names = {fw.requirement_name(r) for r in requirements}
    assert {"lhotse", "jsonargparse", "soundfile", "jiwer", "lightning"} <= names
    assert not names & {"torch", "torchaudio", "av"}
    assert all("#" not in r and r == r.strip() for r in requirements)
    assert "av" in {fw.requirement_name(r) for r in fw.project_requirements(REPO / "setup.cfg")}


def test_what_travels_is_the_missing_requirements_and_their_needs_never_the_images(fw):
    """lhotse needs torch (the image's: not followed, nor its CUDA libraries) and intervaltree (missing: carried,
    but its sortedcontainers is the image's); jsonargparse's extra brings docstring-parser; a marker that does
    not hold on the lease (an old Python, Windows, an extra not asked for) brings nothing."""
    report = {
        "install": [
            item("lhotse", "1.33.0", "torch", "intervaltree>=3.1", "numpy", "pywin32; sys_platform == 'win32'"),
            item("torch", "2.7.1", "nvidia-cublas-cu12; platform_system == 'Linux'"),
            item("nvidia-cublas-cu12", "12.6"),
            item("intervaltree", "3.2.1", "sortedcontainers<3"),
            item("sortedcontainers", "2.4.0"),
            item("jsonargparse", "4.53.0", "PyYAML", "docstring-parser; extra == 'signatures'", "x; extra == 'y'"),
            item("docstring_parser", "0.18.0"),
            item("Lightning", "2.6.6", "torch"),
            item("importlib-resources", "6.0", "zipp"),
            item("typeshed_client", "2.15.0", "importlib-resources>=1.4; python_version < '3.9'"),
            item("pywin32", "311"),
            item("x", "1"),
        ]
    }
    image = {"torch", "numpy", "sortedcontainers", "pyyaml", "lightning"}
    requirements = ["lhotse>=1.30", "jsonargparse[signatures]>=4.39,<5", "lightning>=2.6,<2.7", "typeshed-client"]
    assert fw.missing(report, requirements, image, "3.12") == [
        ("docstring-parser", "0.18.0"),
        ("intervaltree", "3.2.1"),
        ("jsonargparse", "4.53.0"),
        ("lhotse", "1.33.0"),
        ("typeshed-client", "2.15.0"),
    ]
    with pytest.raises(SystemExit, match="pip's resolution holds no jiwer"):
        fw.missing(report, ["jiwer"], image, "3.12")


def test_the_committed_image_list_names_the_images_packages(fw):
    image = fw.image_packages(fw.IMAGE_LIST)
    assert {"torch", "torchaudio", "cupy-cuda13x", "lightning", "numpy", "sentencepiece", "pyyaml"} <= image
    assert not image & {"lhotse", "jsonargparse", "soundfile", "jiwer", "av"}


def test_pip_failing_is_one_line(fw):
    with pytest.raises(SystemExit, match=r"^fetch_wheels: pip failed: .*no-such-option"):
        fw.run_pip(["install", "--no-such-option"])
