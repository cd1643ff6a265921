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
import sys

__all__ = ['CommandError', 'UsageError', 'shown_path']


class UsageError(Exception):
    """A mistake in how the command was called (exit code 2)."""


class CommandError(Exception):
    """The command could not do its work (exit code 1)."""


def shown_path(path: str | bytes | os.PathLike) -> str:
    """``path`` as text that names the file when pasted into a shell.

    A printable name that the terminal's encoding (``sys.stdout``'s) writes as its
    bytes on disk is shown as it is; any other in bash's ``$'...'`` quoting, each
    character that it cannot write so as the ``\\xHH`` escapes of those bytes.

    Example:
        >>> shown_path('cfg.py'), shown_path(b'caf\\xe9.py')
        ('cfg.py', "$'caf\\\\xe9.py'")
    """
    text = os.fsdecode(path)
    encoding = getattr(sys.stdout, 'encoding', None) or 'utf-8'
    if text.isprintable() and _shows(text, encoding):  # (an undecodable byte is not)
        return text
    parts = []
    for char in text:
        if char in "\\'":
            parts.append('\\' + char)
        elif char.isprintable() and _shows(char, encoding):
            parts.append(char)
        else:
            parts.extend(f'\\x{byte:02x}' for byte in os.fsencode(char))
    return "$'" + ''.join(parts) + "'"


def _shows(text: str, encoding: str) -> bool:
    """Whether the terminal writes ``text`` as the bytes it has on disk."""
    try:
        return text.encode(encoding) == os.fsencode(text)
    except (UnicodeError, LookupError):
        return False
