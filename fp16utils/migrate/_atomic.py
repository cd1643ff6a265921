"""Replace a file's content all at once: :func:`atomic_write`, the one way migrate writes.

A unique temporary file beside the target, fsynced, given the target's mode, moved
onto it with ``os.replace``; a link is written through, a read-only file refused. See
"Files are written atomically" in docs/design/reliability.md.
"""

from __future__ import annotations

import os
import stat
import tempfile

__all__ = ['atomic_write']


def resolve_target(path: str | os.PathLike[str]) -> str:
    """Where a write to ``path`` lands: ``path``, or the file its links lead to; OSError if none."""
    path = os.fspath(path)
    if isinstance(path, bytes):  # pragma: no cover - the command passes str
        path = os.fsdecode(path)
    if os.path.islink(path):
        real = os.path.realpath(path)
        if os.path.islink(real):
            raise OSError(40, 'symbolic link loop', path)
        if not os.path.lexists(real):
            # Not an error for a plain file, but a dangling link would create a file
            # somewhere the user did not name: refuse.
            raise OSError(2, f'dangling symbolic link (it points to {real})', path)
        path = real
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, 'is a directory', path)
    if not stat.S_ISREG(mode):
        raise OSError(22, 'not a regular file', path)
    return path


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the content of ``path`` with ``data``; on OSError the target is unchanged."""
    target = resolve_target(path)
    folder = os.path.dirname(os.path.abspath(target))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    else:
        if not mode & 0o222:  # marked read-only for everyone: respect it, even as root
            raise PermissionError(13, 'read-only file (no write permission bit); make it '
                                      'writable first', target)
    fd, tmp = tempfile.mkstemp(prefix=f'.{os.path.basename(target)}.', suffix='.fp16utils-tmp',
                               dir=folder)
    try:
        with os.fdopen(fd, 'wb') as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
