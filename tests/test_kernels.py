"""Where the recurrence's native sources live: inside the package, found the same way by a checkout and a wheel."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from srupp_asr import kernels

REPO = Path(__file__).resolve().parent.parent


def test_a_plain_checkout_imports_the_kernels_from_the_package_folder():
    # Without the editable install's finder (as with PYTHONPATH=. on a fresh checkout) only the folder layout counts.
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
        f"sys.path.insert(0, {str(REPO)!r}); "
        "import srupp_asr.kernels as k; print(k.CUDA_SOURCE)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert Path(done.stdout.strip()) == REPO / "srupp_asr" / "kernels" / "sru_cuda.cu"


def test_the_wheel_ships_every_native_source_and_maps_no_folder_in():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert "kernels" not in setup["options"].get("package_dir", "")
    shipped = setup["options.package_data"]["srupp_asr.kernels"]
    for source in (kernels.CUDA_SOURCE, kernels.CPU_SOURCE, kernels.STEP_HEADER):
        assert source.parent == REPO / "srupp_asr" / "kernels" and source.exists()
        assert f"*{source.suffix}" in shipped
