"""Configs by name and the recipes' decoding configs.

Training configs by name: ``srupp-asr train fit --config tiny_cpu`` works from any directory.

The YAML files of the repository's ``conf/`` ship inside the package (``srupp_asr/conf`` in an installed wheel,
setup.cfg's package data); a source checkout or editable install reads ``conf/`` itself. A ``--config`` value is
a file when one exists at that path (relative to the working directory), else the name of a shipped config:
``tiny_cpu``, ``tiny_cpu.yaml`` and ``conf/tiny_cpu.yaml`` all name ``conf/tiny_cpu.yaml``.

A corpus recipe's decoding config (``conf/decode_*.yaml``: beam, CTC weight, length penalty, LM weight) is read by
:func:`read_decode_config`, which the recipes call as ``python -m srupp_asr.configs decode FILE``: YAML parsed as
YAML, a misspelt key or an out-of-range value refused in one line naming the file, as the decoders would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from srupp_asr.errors import UserError

# The keys of a decoding config, in the order ``python -m srupp_asr.configs decode`` prints their values.
DECODE_CONFIG_KEYS = ("beam", "ctc_weight", "length_penalty", "lm_weight")

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


def read_decode_config(path: str | os.PathLike[str]) -> dict[str, int | float]:
    """The settings of a recipe's decoding config, every one of :data:`DECODE_CONFIG_KEYS` present and checked
    as :class:`~srupp_asr.decoding.DecodingOptions` checks it (a UserError naming ``path`` and the key)."""
    from srupp_asr.decoding.options import DecodingOptions
    from srupp_asr.fileio import read_yaml_mapping

    data = read_yaml_mapping(path, "decoding config")
    keys = ", ".join(DECODE_CONFIG_KEYS)
    for key in data:
        if key not in DECODE_CONFIG_KEYS:
            raise UserError(f"{path}: unknown key {key!r} (a decoding config holds {keys})")
    for key in DECODE_CONFIG_KEYS:
        if key not in data:
            raise UserError(f"{path}: no {key} (a decoding config holds {keys})")
    try:
        DecodingOptions(mode="joint", **{k: data[k] for k in DECODE_CONFIG_KEYS})
    except (TypeError, ValueError) as err:
        raise UserError(f"{path}: {err}") from None
    return {key: data[key] for key in DECODE_CONFIG_KEYS}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m srupp_asr.configs decode FILE``: the values of FILE's :data:`DECODE_CONFIG_KEYS` on one line,
    in that order, for a recipe's shell to read; a problem is one line on stderr and exit status 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "decode":
        print("usage: python -m srupp_asr.configs decode DECODING_CONFIG.yaml", file=sys.stderr)
        return 2
    try:
        print(" ".join(str(value) for value in read_decode_config(args[1]).values()))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
