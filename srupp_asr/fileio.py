"""Reading and writing files safely.

Writing is atomic: a crash or an error leaves either the old file or the new one, never half (a set of files with
:func:`write_files_together`, a whole directory with :func:`replace_dir`). Reading goes through one bounded,
type-checked reader (:func:`read_bytes`, and :func:`read_text`, :func:`read_lines`, :func:`read_yaml_mapping` on
it): a named pipe, a device (``/dev/zero``) or a folder where a file is expected is one line saying what it is, and
no file is read past its bound (:data:`MAX_CONFIG_BYTES`, :data:`MAX_TOKENIZER_BYTES`, :data:`MAX_LIST_BYTES`), so
a hostile model directory or table can neither hang a command nor exhaust its memory."""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from srupp_asr.errors import UserError

MAX_LIST_BYTES = 256 * 2**20  # the most of an ``@LIST`` file, a table or a transcript read (2.5 million 100-byte lines)
# The most of a YAML or JSON config (a model's or an LM's config.yaml, a weights index, ``train --config``) read: a
# real one holds kilobytes, and PyYAML takes some hundred bytes of memory per byte of a crafted one.
MAX_CONFIG_BYTES = 4 * 2**20
MAX_TOKENIZER_BYTES = 64 * 2**20  # the most of a sentencepiece model read (1 million pieces take about 20 MiB)
MAX_TEMP_FORMAT_SUFFIX = 32  # bytes of a name's format suffix kept in its temporary name (``.jsonl.gz``: 9)
# Temporary files and folders are named ``.<host>-<pid>-<random>...``: the writer is known, so a later run can
# remove what a writer that was killed (``kill -9``, power loss) left behind, and nothing a live writer holds.
_TEMP_NAME = re.compile(r"^\.([0-9a-f]{6})-(\d+)-")
_swept: set[str] = set()  # folders whose leftovers this process has removed already


@functools.cache
def _host_tag() -> str:
    return hashlib.blake2s(socket.gethostname().encode(), digest_size=3).hexdigest()


def temp_prefix() -> str:
    """The start of this process's temporary names: ``.`` + a tag of the host name + ``-<pid>-``."""
    return f".{_host_tag()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temps(folder: str | os.PathLike, force: bool = False) -> list[Path]:
    """Delete the temporary files and folders that writers on this host, now dead, left in ``folder`` (a write
    killed with ``kill -9``); returns what was removed. Each folder is swept once per process unless ``force``."""
    folder = Path(folder)
    key = os.path.abspath(folder)
    if key in _swept and not force:
        return []
    _swept.add(key)
    host, removed = _host_tag(), []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if not match or match[1] != host or _alive(int(match[2])):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if info.st_uid != os.getuid():
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:  # gone already, or not ours to remove
            continue
        removed.append(Path(entry.path))
    return removed


def make_temp_dir(path: str | os.PathLike, tag: str = "tmp") -> Path:
    """A new empty hidden folder beside ``path`` (named like every temporary here, see :func:`remove_stale_temps`),
    with the umask's permissions (mkdtemp's are 0700)."""
    path = Path(path)
    remove_stale_temps(path.parent)
    new = Path(tempfile.mkdtemp(dir=path.parent, prefix=temp_prefix(), suffix=f".{tag}"))
    os.chmod(new, 0o777 & ~_umask())
    return new


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # renameat2(2): paths relative to the working directory; swap the two


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """The C library's ``renameat2`` (Linux), or None where there is none."""
    if sys.platform != "linux":
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except OSError:
        return None


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directories ``a`` and ``b`` in one atomic step; False where the system or file system cannot."""
    rename = _renameat2()
    if rename is None:
        return False
    if rename(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # an old kernel, or a file system without the flag: fall back to two renames
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, target: Path) -> None:
    """Rename directory ``new`` to ``target``. An existing ``target`` is exchanged with ``new`` in one step (Linux),
    so ``target`` always holds a whole directory, even to a process killed meanwhile, and the old one, now at
    ``new``'s temporary name, is removed (or swept later); elsewhere it is moved aside first and removed after."""
    if not target.exists():
        os.rename(new, target)
        return
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)
        return
    old = target.with_name(f".{target.name}.{uuid.uuid4().hex}.old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


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

    The temporary file is hidden and short (:func:`temp_prefix` + 8 random characters + the suffix), not derived
    from ``path``'s name: any name the file system allows (up to 255 bytes) can be written. What killed writers
    left in the folder is removed first (:func:`remove_stale_temps`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    suffix = _temp_suffix(path) if temp_suffix is None else temp_suffix
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(), suffix=suffix)
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


def write_files_together(files: dict[Path, bytes]) -> None:
    """Write several files all or nothing (a report's set, a transcript's formats): each is written to a temporary
    file beside it and flushed to disk, and only when every one is written are they renamed over their targets. A
    write that fails (a full disk, a quota, a read-only folder, a name longer than the file system allows, checked
    before anything is written) is a one-line UserError naming the file it was writing; the temporary files are
    removed and no target has changed. (A crash between the renames, which touch no data, can leave some renamed.)"""
    temps: list[tuple[str, Path]] = []
    path = next(iter(files), Path())
    try:
        for path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            _check_name_fits(path)
        for path, data in files.items():
            remove_stale_temps(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(), suffix=_temp_suffix(path))
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
    except OSError as err:
        _remove_temps(temps)
        raise UserError(f"{path}: cannot write ({err.strerror or err}); no file of the set was changed") from None
    except BaseException:
        _remove_temps(temps)
        raise
    try:
        for tmp, path in temps:
            os.replace(tmp, path)
    finally:
        _remove_temps(temps)  # those not renamed: a rename failed (a bug, or the folder went away)
    for folder in {path.parent for path in files}:
        fsync_directory(folder)


def _remove_temps(temps: Sequence[tuple[str, Path]]) -> None:
    for tmp, _ in temps:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _check_name_fits(path: Path) -> None:
    """An ENAMETOOLONG OSError when ``path``'s name is longer than its folder's file system allows (checked before
    a set of files is written, so a too-long last name cannot leave the others replaced)."""
    try:
        limit = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(path.name)) > limit:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))


def check_writable_folder(folder: str | os.PathLike, what: str = "output folder") -> None:
    """Make ``folder`` if needed and write (then remove) a temporary file in it: a folder that cannot be made or
    written (read-only, full, no permission) is a one-line UserError before any work whose results would be lost.
    An actual write, not ``os.access``, which says yes to root on a read-only folder."""
    try:
        os.makedirs(folder, exist_ok=True)
        remove_stale_temps(folder)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=temp_prefix(), suffix=".probe")
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise UserError(f"{folder}: cannot write to the {what} ({err.strerror or err})") from None


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


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (``a pipe``, ``a device``, ...)."""
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a plain file"


def _kind_problem(path: str | os.PathLike, mode: int, what: str) -> UserError | None:
    """The one-line error for a ``path`` of ``mode`` where a regular file (a ``what``) is expected, or None."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return UserError(f"{path}: is a directory, not {_a(what)}")
    return UserError(f"{path}: {what} is not a regular file ({file_kind(mode)}; save it to a file)")


def _a(what: str) -> str:
    """``what`` with its indefinite article (``a config file``, ``an audio file``)."""
    return f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"


def _os_problem(path: str | os.PathLike, err: OSError, what: str) -> UserError:
    """The one-line error for an OSError met opening or reading ``path``."""
    if isinstance(err, FileNotFoundError):
        return UserError(f"{path}: {what} not found")
    if isinstance(err, IsADirectoryError):
        return UserError(f"{path}: is a directory, not {_a(what)}")
    return UserError(f"{path}: cannot read {what} ({err.strerror or err})")


def check_regular_file(path: str | os.PathLike, what: str = "file") -> None:
    """A one-line UserError naming ``path`` unless it is a regular file (symbolic links followed). Checked
    without opening it: opening a named pipe waits for a writer, for ever if none comes, and a device such as
    ``/dev/zero`` never ends."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise _os_problem(path, err, what) from None
    problem = _kind_problem(path, info.st_mode, what)
    if problem is not None:
        raise problem


def read_bytes(
    path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES, streams: bool = False
) -> bytes:
    """The bytes of ``path``, the one way this package reads a small file whole; every problem is a one-line
    UserError naming ``path`` and what is wrong.

    It must be a regular file (links followed): a named pipe, a device or a folder is refused as what it is, after
    opening without blocking (a pipe with no writer would wait for ever) and checking the open file itself (no
    swap between a check and the read). ``streams`` also allows pipes and devices (``@<(find ...)``, ``@/dev/stdin``),
    read blocking. At most ``max_bytes`` are read: a larger file (a sparse one too) is refused before reading, an
    endless stream once the bound is passed."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if streams else getattr(os, "O_NONBLOCK", 0))
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise _os_problem(path, err, what) from None
    too_big = UserError(f"{path}: {what} holds more than {max_bytes / 2**20:g} MiB (the most this reads)")
    info = os.fstat(fd)
    problem = None if streams and not stat.S_ISDIR(info.st_mode) else _kind_problem(path, info.st_mode, what)
    if problem is None and stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
        problem = too_big
    if problem is not None:
        os.close(fd)
        raise problem
    with open(fd, "rb", closefd=True) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as err:
            raise _os_problem(path, err, what) from None
    if len(data) > max_bytes:
        raise too_big
    return data


def read_text(
    path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_LIST_BYTES, streams: bool = False
) -> str:
    """A UTF-8 text file read with :func:`read_bytes`; every problem is a one-line UserError naming ``path``."""
    raw = read_bytes(path, what, max_bytes, streams)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: {what} is not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_lines(
    path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_LIST_BYTES, max_line_chars: int | None = None
) -> list[str]:
    """The lines of a UTF-8 text file, as Kaldi, NeMo, sclite and shells read them: a byte-order mark at the start
    (Windows editors write one) is not text, and lines end at ``\\n`` or ``\\r\\n`` only (``str.splitlines``
    would also split a line at U+2028, U+0085 or a form feed, which JSON written with ``ensure_ascii=False`` and
    file names may hold). A last line ending in a newline adds no empty line after it. Every problem is a one-line
    UserError naming ``path``; bytes that are not UTF-8 name their line too.

    Read with :func:`read_bytes` (``streams``: a pipe such as ``@<(find ...)`` may be read), at most ``max_bytes``
    (an endless stream such as ``/dev/zero`` ends at the bound). ``max_line_chars`` bounds each line (a longer one
    is a UserError naming its line)."""
    lines = split_lines(decode_text(read_bytes(path, what, max_bytes, streams=True), path, what))
    if max_line_chars is not None:
        for number, line in enumerate(lines, start=1):
            if len(line) > max_line_chars:
                raise UserError(
                    f"{path}:{number}: a line of {len(line):,} characters, more than the {max_line_chars:,} one line"
                    f" of a {what} may hold (split it)"
                )
    return lines


def decode_text(raw: bytes, path: str | os.PathLike, what: str = "file") -> str:
    """``raw`` as UTF-8 text without a leading byte-order mark (Windows editors write one); bytes that are not UTF-8
    are a one-line UserError naming ``path`` and their line."""
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = start + err.start
        line = raw.count(b"\n", 0, at) + 1
        raise UserError(f"{path}:{line}: {what} is not UTF-8 text ({err.reason} at byte {at})") from None


def split_lines(text: str) -> list[str]:
    """``text``'s lines, ending at ``\\n`` or ``\\r\\n`` only; a last newline adds no empty line."""
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def is_inside(path: str | os.PathLike, roots: Sequence[Path]) -> bool:
    """Whether ``path``, symbolic links resolved, lies in one of the folders ``roots`` (themselves resolved)."""
    real = Path(os.path.realpath(path))
    return any(real == root or root in real.parents for root in roots)


def read_yaml_mapping(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; every problem is a one-line UserError naming ``path``."""
    import yaml

    try:
        data = yaml.safe_load(read_text(path, what, MAX_CONFIG_BYTES))
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{path}: not valid YAML{line} ({problem})") from None
    except RecursionError:  # PyYAML composes nested collections recursively: [[[[...]]]] some hundreds deep
        raise UserError(f"{path}: not a usable {what} (YAML nested too deeply)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a {what} must hold a YAML mapping")
    return data


class LockHeld(Exception):
    """:func:`take_pid_lock` found the lock held; ``holder`` is the pid the holder wrote (``?`` if none)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def take_pid_lock(path: str | os.PathLike[str]) -> int:
    """Take an exclusive ``flock`` on ``path`` (created if missing) and write this process's pid into it; return
    its descriptor (closing it releases the lock, as the process's end does, however it ends). Raises
    :class:`LockHeld` with the holder's pid when another process holds it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise LockHeld(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
