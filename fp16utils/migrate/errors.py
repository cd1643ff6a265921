"""The two errors of the ``fp16utils`` command: a usage mistake and a failure.

They live here, with the standard library only, because reading a config file
(:mod:`fp16utils.migrate.config_files`) raises them too, and the migrate tools never
import the command. The command turns a :class:`UsageError` into exit code 2 and a
:class:`CommandError` into exit code 1, each as one line on stderr.

Example:
    >>> try:
    ...     raise UsageError('cfg.py: no such config file')
    ... except UsageError as err:
    ...     str(err)
    'cfg.py: no such config file'
"""

from __future__ import annotations

__all__ = ['CommandError', 'UsageError']


class UsageError(Exception):
    """A mistake in how the command was called (exit code 2)."""


class CommandError(Exception):
    """The command could not do its work (exit code 1)."""
