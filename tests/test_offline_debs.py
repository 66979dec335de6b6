"""recipes/synth_en/local/{fetch,install}_debs.sh: the .debs that carry the TTS engines to a machine without a
package registry.

Offline parts only: install_debs.sh installs a tiny .deb built here (``dpkg-deb --build``) into a fake root
(``--root``; the self-check and ldconfig only run for ``/``): it copies what is missing, never overwrites a file,
keeps a ``lib -> usr/lib`` directory symlink, lists what it added, adds nothing the second time, and refuses a
missing folder, an empty one, a .deb of another architecture and a user other than root, each with one line.
fetch_debs.sh fails with one line when the registry cannot be reached (an unreachable proxy stands in for no
network). Both scripts pass shellcheck. The full install (every engine on a system that lacked it) is checked by
hand in a chroot: see the report in the commit that added these scripts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ROOT / "recipes" / "synth_en" / "local"
FETCH = LOCAL / "fetch_debs.sh"
INSTALL = LOCAL / "install_debs.sh"
RECORD = Path("var/lib/srupp-asr/offline-debs/files.txt")

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian or Ubuntu)")


def _as_root() -> list[str]:
    """The prefix that runs a command as root: none when we are root, else a user namespace (or skip)."""
    if os.geteuid() == 0:
        return []
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-r", "true"], capture_output=True, check=False).returncode == 0:
        return [unshare, "-r"]
    pytest.skip("needs root, or user namespaces (unshare -r), to run install_debs.sh")


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kwargs)


def _install(*args: str | Path) -> subprocess.CompletedProcess:
    return _run([*_as_root(), "bash", str(INSTALL), *map(str, args)])


def _one_line_error(done: subprocess.CompletedProcess, script: str, words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{script}: ") and words in lines[0], lines[0]


def _host_arch() -> str:
    return _run(["dpkg", "--print-architecture"]).stdout.strip()


def _build_deb(tmp_path: Path, name: str = "srupp-fake", arch: str = "all", postinst: str = "") -> Path:
    """A .deb with a new file, a file the system already has, a symlink, and a library under lib/."""
    tree = tmp_path / f"{name}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: {arch}\nMaintainer: test <test@example.org>\n"
        "Description: install_debs.sh test package\n"
    )
    if postinst:
        (tree / "DEBIAN" / "postinst").write_text(f"#!/bin/sh\nset -e\n{postinst}\n")
        (tree / "DEBIAN" / "postinst").chmod(0o755)
    share = tree / "usr" / "share" / "srupp-fake"
    share.mkdir(parents=True)
    (share / "new.txt").write_text("from the package\n")
    (share / "existing.txt").write_text("from the package\n")
    (share / "link").symlink_to("new.txt")
    lib = tree / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libsruppfake.so.1").write_text("not really a library\n")
    debs = tmp_path / "debs"
    debs.mkdir(exist_ok=True)
    deb = debs / f"{name}_1.0_{arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)]).check_returncode()
    return debs


def _fake_root(tmp_path: Path) -> Path:
    """A merged-/usr root (lib -> usr/lib) that already has one of the package's files."""
    root = tmp_path / "root"
    (root / "usr" / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "usr" / "share" / "srupp-fake").mkdir(parents=True)
    (root / "usr" / "share" / "srupp-fake" / "existing.txt").write_text("the system's own\n")
    return root


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and symlink under ``root``: its kind or target, and its modification time."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = ("-> " + os.readlink(path), path.lstat().st_mtime_ns)
        elif path.is_file():
            out[str(path.relative_to(root))] = (path.read_text(), path.stat().st_mtime_ns)
    return out


@needs_dpkg
def test_install_copies_missing_files_and_never_overwrites(tmp_path):
    debs, root = _build_deb(tmp_path), _fake_root(tmp_path)
    done = _install("--root", root, debs)
    assert done.returncode == 0, done.stderr
    assert "3 files added" in done.stdout and "1 already there" in done.stdout, done.stdout
    share = root / "usr" / "share" / "srupp-fake"
    assert (share / "new.txt").read_text() == "from the package\n"
    assert (share / "existing.txt").read_text() == "the system's own\n"  # not overwritten
    assert (share / "link").is_symlink() and os.readlink(share / "link") == "new.txt"
    assert (root / "lib").is_symlink() and os.readlink(root / "lib") == "usr/lib"  # the directory link is kept
    assert (root / "usr" / "lib" / "x86_64-linux-gnu" / "libsruppfake.so.1").is_file()
    assert (root / RECORD).read_text().splitlines() == [
        "/lib/x86_64-linux-gnu/libsruppfake.so.1",
        "/usr/share/srupp-fake/link",
        "/usr/share/srupp-fake/new.txt",
    ]


@needs_dpkg
def test_install_is_idempotent(tmp_path):
    debs, root = _build_deb(tmp_path), _fake_root(tmp_path)
    assert _install("--root", root, debs).returncode == 0
    before = _snapshot(root)
    again = _install("--root", root, debs)
    assert again.returncode == 0, again.stderr
    assert "0 files added" in again.stdout and "4 already there" in again.stdout, again.stdout
    assert _snapshot(root) == before


@needs_dpkg
def test_install_warns_about_alternatives_it_does_not_set(tmp_path):
    debs = _build_deb(tmp_path, postinst="update-alternatives --install /usr/bin/fake fake /usr/bin/true 10")
    done = _install("--root", _fake_root(tmp_path), debs)
    assert done.returncode == 0, done.stderr
    assert "srupp-fake's maintainer scripts call update-alternatives" in done.stderr


@needs_dpkg
def test_install_refuses_a_missing_or_empty_folder(tmp_path):
    done = _install("--root", tmp_path, tmp_path / "nowhere")
    assert done.returncode == 2
    _one_line_error(done, "install_debs.sh", "no such folder")
    (tmp_path / "empty").mkdir()
    done = _install("--root", tmp_path, tmp_path / "empty")
    assert done.returncode == 2
    _one_line_error(done, "install_debs.sh", "no .deb files")


@needs_dpkg
def test_install_refuses_another_architecture(tmp_path):
    other = "arm64" if _host_arch() != "arm64" else "amd64"
    debs, root = _build_deb(tmp_path, arch=other), _fake_root(tmp_path)
    done = _install("--root", root, debs)
    assert done.returncode == 1
    _one_line_error(done, "install_debs.sh", f"is for {other}")
    assert not (root / "usr" / "share" / "srupp-fake" / "new.txt").exists()


def test_install_refuses_a_user_other_than_root(tmp_path):
    script = INSTALL
    argv = ["bash", str(script), "--root", str(tmp_path), str(tmp_path)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv (util-linux) to drop root")
        # The unprivileged user must be able to read the script: a checkout under a private (0700) folder, such as
        # one made by mktemp -d, would hide it, so run a copy from a world-readable folder.
        shared = Path(tempfile.mkdtemp())
        shared.chmod(0o755)
        script = Path(shutil.copy(INSTALL, shared / INSTALL.name))
        script.chmod(0o755)
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(script), *argv[2:]]
    try:
        done = _run(argv, cwd="/")
    finally:
        if script != INSTALL:
            shutil.rmtree(script.parent)
    assert done.returncode == 2
    _one_line_error(done, "install_debs.sh", "must run as root")


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
def test_fetch_fails_in_one_line_without_the_registry(tmp_path):
    config = tmp_path / "apt.conf"
    config.write_text(
        'Acquire::http::Proxy "http://127.0.0.1:9";\nAcquire::https::Proxy "http://127.0.0.1:9";\n'
        'Acquire::Retries "0";\n'
    )
    done = _run(["bash", str(FETCH), str(tmp_path / "debs")], env={**os.environ, "APT_CONFIG": str(config)})
    assert done.returncode == 1, done.stdout + done.stderr
    _one_line_error(done, "fetch_debs.sh", "")
    assert not list(tmp_path.rglob("*.deb"))


def test_fetch_usage():
    help_text = _run(["bash", str(FETCH), "--help"])
    assert help_text.returncode == 0 and "install_debs.sh" in help_text.stdout
    done = _run(["bash", str(FETCH), "--bogus"])
    assert done.returncode == 2
    _one_line_error(done, "fetch_debs.sh", "unknown option --bogus")
    assert "--only espeak-ng" in help_text.stdout
    done = _run(["bash", str(FETCH), "--only"])
    assert done.returncode == 2
    _one_line_error(done, "fetch_debs.sh", "--only needs a package name")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
@pytest.mark.parametrize("script", [FETCH, INSTALL], ids=lambda p: p.name)
def test_shellcheck_clean(script):
    done = _run(["shellcheck", str(script)])
    assert done.returncode == 0, done.stdout
