"""Download the Python wheels a GPU lease's machine lacks into ``.whl`` (carried there; device_run.sh and
benchmarks/gpu_session.sh install them into /tmp/site first).

The machine runs its image's own python3 (3.12) with torch, CuPy, Lightning and much else already installed and
no package registry, so what travels is exactly what this project needs that the image does not hold: pip resolves
the project's requirements (``setup.cfg``'s ``install_requires``) for that Python and platform, and the packages
carried are those requirements the image lacks (``device_image.txt``, its package list as last read) and what they
need in turn, followed through the resolution's dependency metadata but never into a package the image holds (its
own dependencies are there with it: lhotse needs torch, and torch's CUDA libraries must stay the image's). One
wheel each, no sdists. PyAV (35 MiB) is left out unless ``--with-av``: the toolkit imports it only to read FFmpeg
containers (mp3, m4a), and a lease's audio is WAV, FLAC and Ogg, which soundfile reads. ``DIR/MANIFEST.txt``
lists the wheels; the total size is printed (a lease's call sends at most 64 MiB: ``lease_tree.sh size .whl``).

    python recipes/synth_en/local/fetch_wheels.py                 # -> .whl at the repository root
    python recipes/synth_en/local/fetch_wheels.py --dry-run       # what would be downloaded, nothing written
    python recipes/synth_en/local/fetch_wheels.py DIR --python-version 3.12 --with-av

Exit status: 0 done, 1 pip failed (its last line is printed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import configparser
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
IMAGE_LIST = Path(__file__).resolve().parent / "device_image.txt"
# The image's own: never carried (a second torch would stop the install; the image's build matches its driver)
LEFT_TO_THE_IMAGE = ("torch", "torchaudio")
LEFT_OUT = ("av",)  # unless --with-av (see above)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def normalize(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503): lower case, runs of ``-_.`` one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution name of a requirement line (``lhotse>=1.30`` -> ``lhotse``; extras and markers dropped)."""
    from packaging.requirements import Requirement

    return normalize(Requirement(requirement).name)


def project_requirements(setup_cfg: Path, leave_out: tuple[str, ...] = ()) -> list[str]:
    """``install_requires`` of ``setup_cfg``, without comments, the packages always left to the image (torch,
    torchaudio) and ``leave_out``."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)
    lines = [line.split("#", 1)[0].strip() for line in parser.get("options", "install_requires").splitlines()]
    dropped = {*LEFT_TO_THE_IMAGE, *leave_out}
    return [line for line in lines if line and requirement_name(line) not in dropped]


def image_packages(path: Path) -> set[str]:
    """The normalised names of ``path``: one or more per line, separated by commas or spaces; ``#`` comments."""
    names = set()
    for line in path.read_text().splitlines():
        names.update(normalize(n) for n in re.split(r"[,\s]+", line.split("#", 1)[0]) if n)
    return names


def missing(report: dict, requirements: list[str], image: set[str], python_version: str) -> list[tuple[str, str]]:
    """``(name, version)``, sorted, of the packages to carry: of pip's installation ``report`` (``--report`` of a
    resolution of ``requirements``), each requirement the ``image`` lacks and, recursively, what it requires (its
    ``Requires-Dist`` whose markers hold on the lease: Linux x86-64, CPython ``python_version``, the extras asked
    for), stopping at packages the image holds."""
    from packaging.requirements import Requirement

    found = {normalize(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    environment |= {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    environment |= {"os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    todo = [Requirement(line) for line in requirements]
    carried: dict[str, set[str]] = {}  # name -> the extras it was asked for
    while todo:
        requirement = todo.pop()
        name = normalize(requirement.name)
        if name in image or name in LEFT_TO_THE_IMAGE:
            continue
        if name not in found:
            raise SystemExit(f"fetch_wheels: pip's resolution holds no {name} (a requirement of the project's)")
        extras = set(requirement.extras)
        if name in carried and extras <= carried[name]:
            continue
        carried[name] = carried.get(name, set()) | extras
        for line in found[name].get("requires_dist", []):
            needed = Requirement(line)
            marker = needed.marker
            if marker is None or any(marker.evaluate(environment | {"extra": e}) for e in ({""} | carried[name])):
                todo.append(needed)
    return sorted((name, found[name]["version"]) for name in carried)


def target_options(python_version: str) -> list[str]:
    """pip's options that make it resolve and download for the lease's Python and platform, wheels only."""
    options = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def run_pip(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise SystemExit(f"fetch_wheels: pip failed: {last}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", type=Path, default=ROOT / ".whl", help="where the wheels go (default .whl)")
    p.add_argument("--python-version", default="3.12", help="the lease's python3 (default 3.12)")
    p.add_argument("--with-av", action="store_true", help="carry PyAV too (35 MiB; FFmpeg containers)")
    p.add_argument("--image", type=Path, default=IMAGE_LIST, help="the image's package names")
    p.add_argument("--dry-run", action="store_true", help="print what would be downloaded")
    args = p.parse_args(argv)
    requirements = project_requirements(ROOT / "setup.cfg", () if args.with_av else LEFT_OUT)
    image = image_packages(args.image)
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        resolve = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report_path)]
        resolve += ["--target", str(Path(tmp) / "target"), *target_options(args.python_version), *requirements]
        run_pip(resolve)
        wanted = missing(json.loads(report_path.read_text()), requirements, image, args.python_version)
    pins = [f"{name}=={version}" for name, version in wanted]
    if args.dry_run:
        print("\n".join(pins))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    for old in args.dir.glob("*.whl"):  # exactly this set: two versions of one package stop the install there
        old.unlink()
    run_pip(["download", "--no-deps", "--quiet", "-d", str(args.dir), *target_options(args.python_version), *pins])
    wheels = sorted(args.dir.glob("*.whl"))
    (args.dir / "MANIFEST.txt").write_text("".join(f"{w.name}\t{w.stat().st_size}\n" for w in wheels))
    total = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {total:.1f} MiB in {args.dir} (Python {args.python_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
