"""Writing files atomically: a crash or an error leaves either the old file or the new one, never half."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from srupp_asr.errors import UserError

MAX_TEMP_FORMAT_SUFFIX = 32  # bytes of a name's format suffix kept in its temporary name (``.jsonl.gz``: 9)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_suffix(path: Path) -> str:
    """``.tmp`` and ``path``'s format suffix (``.flac``, ``.jsonl.gz``), so writers that go by the name pick the
    right format; an overlong suffix is left out, so the temporary name always fits the file system."""
    suffix = "".join(path.suffixes[-2:]) if path.name.endswith(".gz") else path.suffix
    return f".tmp{suffix}" if len(os.fsencode(suffix)) <= MAX_TEMP_FORMAT_SUFFIX else ".tmp"


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, temp_suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffixes, so writers pick the right format, unless
    ``temp_suffix`` is given); when the block succeeds it replaces ``path`` atomically, otherwise it is removed.

    The temporary file is hidden and short (``.`` + 8 random characters + the suffix), not derived from ``path``'s
    name: any name the file system allows (up to 255 bytes) can be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = _temp_suffix(path) if temp_suffix is None else temp_suffix
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:  # the data is on disk before the rename makes it visible
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it owner-only; a normal file follows the umask
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def fsync_directory(folder: str | os.PathLike) -> None:
    """Flush ``folder``'s entries (a rename into it) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (UTF-8)."""
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """Read a UTF-8 text file; every problem is a one-line UserError naming ``path``."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a {what}") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read {what} ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: {what} is not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_yaml_mapping(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; every problem is a one-line UserError naming ``path``."""
    import yaml

    try:
        data = yaml.safe_load(read_text(path, what))
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{path}: not valid YAML{line} ({problem})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a {what} must hold a YAML mapping")
    return data
