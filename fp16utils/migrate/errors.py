"""The two errors of the ``fp16utils`` command: a usage mistake and a failure.

They live here, with the standard library only, because reading a config file
(:mod:`fp16utils.migrate.config_files`) raises them too, and the migrate tools never
import the command. The command turns a :class:`UsageError` into exit code 2 and a
:class:`CommandError` into exit code 1, each as one line on stderr, where a file
is named as :func:`shown_path` writes it.

Example:
    >>> try:
    ...     raise UsageError('cfg.py: no such config file')
    ... except UsageError as err:
    ...     str(err)
    'cfg.py: no such config file'
"""

from __future__ import annotations

import os

__all__ = ['CommandError', 'UsageError', 'shown_path']


class UsageError(Exception):
    """A mistake in how the command was called (exit code 2)."""


class CommandError(Exception):
    """The command could not do its work (exit code 1)."""


def shown_path(path: str | bytes | os.PathLike) -> str:
    """``path`` as text that names the file when pasted into a shell.

    A printable name is shown as it is; one with undecodable bytes or control
    characters in bash's ``$'...'`` quoting, each such byte as ``\\xHH``.

    Example:
        >>> shown_path('cfg.py'), shown_path(b'caf\\xe9.py')
        ('cfg.py', "$'caf\\\\xe9.py'")
    """
    text = os.fsdecode(path)
    if text.isprintable():  # (a surrogate-escaped byte is not printable)
        return text
    parts = []
    for char in text:
        if char in "\\'":
            parts.append('\\' + char)
        elif char.isprintable():
            parts.append(char)
        else:
            parts.extend(f'\\x{byte:02x}' for byte in os.fsencode(char))
    return "$'" + ''.join(parts) + "'"
