"""Training configs by name: ``srupp-asr train fit --config tiny_cpu`` works from any directory.

The YAML files of the repository's ``conf/`` ship inside the package (``srupp_asr/conf`` in an installed wheel,
setup.cfg's package data); a source checkout or editable install reads ``conf/`` itself. A ``--config`` value is
a file when one exists at that path (relative to the working directory), else the name of a shipped config:
``tiny_cpu``, ``tiny_cpu.yaml`` and ``conf/tiny_cpu.yaml`` all name ``conf/tiny_cpu.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from srupp_asr.errors import UserError

_PACKAGE = Path(__file__).resolve().parent


def shipped_config_dir() -> Path | None:
    """The folder of the shipped configs: the package's ``conf`` (installed wheel), else the checkout's ``conf/``
    beside the package (source tree, editable install); None when neither holds any."""
    for folder in (_PACKAGE / "conf", _PACKAGE.parent / "conf"):
        if folder.is_dir() and any(folder.glob("*.yaml")):
            return folder
    return None


def config_names() -> list[str]:
    """The names of the shipped configs (``tiny_cpu``, ``train_srupp``, ...), sorted."""
    folder = shipped_config_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder is not None else []


def resolve_config(value: str | os.PathLike[str]) -> str:
    """The file a ``--config`` value names: itself when it exists, else the shipped config of that name (with or
    without ``.yaml``, with or without a leading ``conf/``); a UserError listing the names when there is none."""
    path = Path(value)
    if path.exists():
        return os.fspath(value)
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    folder = shipped_config_dir()
    if folder is not None and (folder / f"{name}.yaml").is_file() and path.parent in (Path(), Path("conf")):
        return str(folder / f"{name}.yaml")
    names = ", ".join(config_names()) or "none installed"
    raise UserError(f"{value}: config file not found, and no shipped config of that name (shipped: {names})")


def resolve_config_args(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every ``-c`` / ``--config`` (``--config=X`` too) resolved by
    :func:`resolve_config`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out):
            out[i + 1] = resolve_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve_config(arg.split("=", 1)[1])
    return out
