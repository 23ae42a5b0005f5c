"""Every file fgc reads back or writes goes through here: no write follows a link, no read
waits on a FIFO or a device, no cache entry is trusted.

Writing: `atomic_write(path, data)` or `with open_atomic(path) as f: ...` creates a fresh
temporary file in the target's folder (`mkstemp`: O_CREAT|O_EXCL, so an existing name or
link there is never opened), writes, fsyncs, and renames it over `path`; a rename replaces
a link planted at `path` instead of writing through it. On any failure, or an interrupt, the
temporary is removed and `path` is as it was.

Reading: `read_regular(path, limit)` opens without blocking (a FIFO gives no hang), refuses
anything but a regular file, and never reads more than `limit` bytes (`/dev/zero` is not a
regular file; a file that grows while read is cut off and refused).

Caches: `private_dir(path)` is a folder only this user can enter (created 0700, refused when
it is a link, another user's, or open to others); `read_entry` reads one entry of it only
when it is a regular file of this user, not a link.

This module is the one place for these rules, so it imports nothing beyond the standard
library; `compiler/` uses it too (runtime/ never imports compiler/, the other way is fine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
import threading
from pathlib import Path

TMP_SUFFIX = ".fgc-tmp"


class FileError(OSError):
    """A file that is not what fgc reads: a FIFO, a device, a folder, a link, or too big."""


# ---------------------------------------------------------------- writing


def umask_mode(mode: int = 0o666) -> int:
    """`mode` under the process's umask: what `open()` would have given a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None,
                fsync: bool = True, file_mode: int | None = None):
    """A file object whose contents replace `path` when the block ends without an error.

    The temporary lives in `path`'s folder (so the rename is atomic) under a fresh name;
    `file_mode` (default 0666 under the umask) is set before the rename."""
    path = Path(path)
    if mode not in ("wb", "w"):
        raise ValueError(f"open_atomic writes whole files (mode 'w' or 'wb'), not {mode!r}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:80]}.", suffix=TMP_SUFFIX)
    try:
        with interrupts_as_exceptions():
            with os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None) as f:
                yield f
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.chmod(tmp, umask_mode() if file_mode is None else file_mode)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str, *, fsync: bool = True,
                 file_mode: int | None = None) -> None:
    """Replace `path` with `data` (str is written as UTF-8) through a fresh temporary."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open_atomic(path, "wb", fsync=fsync, file_mode=file_mode) as f:
        f.write(data)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make renames inside a folder durable (best effort: not every file system can)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind (removing temporaries) and exit."""

    def __init__(self, signum: int):
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def interrupts_as_exceptions():
    """SIGTERM and SIGHUP raise `Terminated` inside the block, so `finally` clauses clean
    up what the block wrote instead of leaving it behind (SIGINT already raises
    KeyboardInterrupt). Only the main thread can take signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):
        raise Terminated(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            current = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if current in (signal.SIG_DFL, None):  # someone else's handler stays theirs
            previous[sig] = current
            signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


# ---------------------------------------------------------------- reading


def describe_kind(st: os.stat_result) -> str:
    m = st.st_mode
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(m):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike, *, follow: bool = True) -> int:
    """A read-only descriptor of a regular file, opened without blocking on FIFOs or
    devices; raises FileError for anything else (FileNotFoundError etc. pass through)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and e.errno == 40:  # ELOOP: the last component is a link
            raise FileError(40, "is a symbolic link", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileError(21 if stat.S_ISDIR(st.st_mode) else 22,
                            f"is {describe_kind(st)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int, *, follow: bool = True) -> bytes:
    """The whole of a regular file of at most `limit` bytes; FileError otherwise."""
    fd = open_regular(path, follow=follow)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileError(27, f"is larger than {limit:,} bytes", str(path))
    return data


# ---------------------------------------------------------------- caches


def cache_home() -> Path:
    """`$XDG_CACHE_HOME/fgc`, else `~/.cache/fgc` (as Python, pip and others do)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        base = str(Path.home() / ".cache")
    return Path(base) / "fgc"


def private_dir(path: str | os.PathLike) -> Path | None:
    """`path` as a folder only this user can use, created 0700 (with its parents) when
    missing; None when it cannot be trusted (a link, another user's, writable by others)
    or made. A cache that is not private is not used."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    if st.st_mode & 0o077:
        try:
            os.chmod(path, 0o700, follow_symlinks=False)
        except OSError:
            return None
    return path


def read_entry(path: str | os.PathLike, limit: int) -> bytes | None:
    """One cache entry's bytes, or None when it is missing, not a regular file of this
    user's (a link, a FIFO, a folder), or larger than `limit`: such entries are rebuilt."""
    try:
        fd = open_regular(path, follow=False)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_uid != os.geteuid():
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def remove_stale_temporaries(folder: str | os.PathLike, prefix: str = ".") -> int:
    """Remove temporaries (`*.fgc-tmp`) an interrupted fgc left in `folder`; the count.
    Only regular files and links are removed, never what they point to."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(prefix) and entry.name.endswith(TMP_SUFFIX) and \
                    not entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed += 1
    return removed
