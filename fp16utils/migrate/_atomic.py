"""Replace a file's content all at once: :func:`atomic_write`, the one way migrate writes.

The new content goes to a temporary file with a unique name, created exclusively
(``tempfile.mkstemp``: ``O_CREAT | O_EXCL``, so a link planted under any name is
never followed) in the target's own folder; it is flushed and fsynced, given the
mode of the file it replaces, and moved onto the target with ``os.replace``.
Readers see the old file or the new one, never half of one; two concurrent writers
never share a temporary file; on any failure the temporary file is removed and the
target is left as it was.

A file that is marked read-only (no write bit at all) is refused, even for root.

Symbolic links: a target that is a link is written *through* it, on purpose: the
link is resolved once (``os.path.realpath``) and the file it points to is replaced,
so the link stays a link. A link that points nowhere, or into a loop, is refused.
Standard library only.

Example:
    >>> import pathlib, tempfile
    >>> f = pathlib.Path(tempfile.mkdtemp()) / 'out.py'
    >>> atomic_write(f, b'x = 1' + bytes([10]))
    >>> f.read_text()
    'x = 1\\n'
"""

from __future__ import annotations

import os
import stat
import tempfile

__all__ = ['atomic_write']


def resolve_target(path: str | os.PathLike[str]) -> str:
    """The file a write to ``path`` lands in: ``path`` itself, or where its links lead.

    Raises:
        OSError: ``path`` is a link that points nowhere (or into a loop), or is an
            existing folder or other non-regular file (a FIFO, a device).

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> open(os.path.join(d, 'real.py'), 'w').close()
        >>> os.symlink('real.py', os.path.join(d, 'link.py'))
        >>> resolve_target(os.path.join(d, 'link.py')) == os.path.realpath(d + '/real.py')
        True
    """
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
    """Replace the content of ``path`` with ``data`` atomically (see the module doc).

    Args:
        path: The file to write; it may not exist yet (its folder must). A link is
            written through: the file it points to is replaced, the link stays.
        data: The new content.

    Raises:
        OSError: The folder is missing or not writable, ``path`` is a folder, a
            FIFO, a dangling link, ... The target is unchanged and no temporary file
            is left behind.

    Example:
        >>> import os, pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (d / 'a.py').write_text('old')
        3
        >>> os.chmod(d / 'a.py', 0o640)
        >>> atomic_write(d / 'a.py', b'new')
        >>> (d / 'a.py').read_text(), oct(os.stat(d / 'a.py').st_mode & 0o777)
        ('new', '0o640')
        >>> sorted(p.name for p in d.iterdir())
        ['a.py']
    """
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
