"""The ``fp16utils`` command's two errors, and how a file is named in them.

The command turns a :class:`UsageError` into exit code 2 and a :class:`CommandError`
into exit code 1, each one line on stderr; reading a config file raises them too.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ['PROG', 'CommandError', 'UsageError', 'one_line', 'prose', 'short_repr', 'shown_path']

#: The command's name, as its messages start.
PROG = 'fp16utils'


class UsageError(Exception):
    """A mistake in how the command was called (exit code 2)."""


class CommandError(Exception):
    """The command could not do its work (exit code 1)."""


def shown_path(path: str | bytes | os.PathLike) -> str:
    """``path`` as text that pastes into a shell: as it is, or in bash's ``$'...'`` quoting."""
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


def prose(text: str) -> str:
    """``text`` printable on any terminal (undecodable bytes as U+FFFD)."""
    return text.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')


def one_line(message: object) -> str:
    """A message on one line (an exception's own newlines folded into spaces)."""
    return prose(' '.join(str(message).split()))


def short_repr(value: Any, limit: int = 120) -> str:
    """A one-line rendering of a value for a message, cut to ``limit`` characters."""
    try:
        text = str(value) if isinstance(value, BaseException) else repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ in the user's config
        text = f'<{type(value).__name__}>'
    text = ' '.join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + '...'
