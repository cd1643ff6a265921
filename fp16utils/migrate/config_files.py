"""Config files: read a Python config (with its ``_base_`` files) and write one back.

:func:`load_config` runs the file and keeps its top-level values; :func:`format_config`
writes a config dict as a readable Python file. Standard library only.

Example:
    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / 'base.py').write_text("optimizer = dict(type='SGD', lr=0.1)")
    >>> _ = (d / 'c.py').write_text("_base_ = 'base.py'" + chr(10) + 'optimizer = dict(lr=0.2)')
    >>> print(format_config(load_config(d / 'c.py')), end='')
    optimizer = dict(type='SGD', lr=0.2)
"""

from __future__ import annotations

import os
import runpy
import types
import warnings
from pathlib import Path
from typing import Any

from .errors import CommandError, UsageError

__all__ = ['format_config', 'load_config']


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Python config file (top-level assignments), resolving ``_base_``.

    Base files are resolved relative to the file that names them and merged
    first; the file's own values are merged into them (dicts recursively, a
    dict with ``_delete_=True`` replaces the base one).

    Args:
        path: The config file.

    Returns:
        The config as a dict.

    Raises:
        UsageError: When the file does not exist.
        CommandError: When it cannot be executed.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> _ = open(os.path.join(d, 'c.py'), 'w').write('fp16 = dict(loss_scale=512.)')
        >>> load_config(os.path.join(d, 'c.py'))
        {'fp16': {'loss_scale': 512.0}}
    """
    return _load_config(Path(path), ())


def _load_config(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in chain:
        raise CommandError(f'{path}: _base_ files include each other in a cycle')
    if not path.is_file():
        if chain:
            raise CommandError(f'{chain[-1]}: _base_ file {path} does not exist')
        raise UsageError(f'{path}: no such config file')
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            namespace = runpy.run_path(str(path), run_name='__config__')
    except SyntaxError as err:
        raise CommandError(f'{path}:{err.lineno}: syntax error: {err.msg}') from None
    except Exception as err:  # the file is the user's code: report, do not crash
        raise CommandError(f'{path}: could not be executed: {type(err).__name__}: {err}'
                           ) from None
    bases = namespace.get('_base_', [])
    if isinstance(bases, str):
        bases = [bases]
    merged: dict[str, Any] = {}
    for base in bases:
        merged = _merge(merged, _load_config(path.parent / base, (*chain, path)))
    own = {k: v for k, v in namespace.items() if _is_config_value(k, v)}
    return _merge(merged, own)


def _is_config_value(key: str, value: Any) -> bool:
    if key.startswith('_'):
        return False
    return not isinstance(value, (types.ModuleType, types.FunctionType, type))


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and value.get('_delete_'):
            out[key] = {k: v for k, v in value.items() if k != '_delete_'}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def format_config(cfg: dict[str, Any]) -> str:
    """Write a config dict as a readable Python config file.

    Dicts whose keys are identifiers are written as ``dict(key=value)``.

    Example:
        >>> print(format_config({'optim_wrapper': {'type': 'AmpOptimWrapper'}}), end='')
        optim_wrapper = dict(type='AmpOptimWrapper')
    """
    lines = [f'{key} = {_format_value(value, 0)}' for key, value in cfg.items()]
    return '\n'.join(lines) + '\n'


def _format_value(value: Any, indent: int) -> str:
    pad = '    ' * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return 'dict()'
        if all(isinstance(k, str) and k.isidentifier() for k in value):
            items = [f'{k}={_format_value(v, indent + 1)}' for k, v in value.items()]
            one_line = f'dict({", ".join(items)})'
            if len(one_line) + 4 * indent <= 80 and '\n' not in one_line:
                return one_line
            return 'dict(\n' + ',\n'.join(pad + i for i in items) + ')'
        items = [f'{k!r}: {_format_value(v, indent + 1)}' for k, v in value.items()]
        return '{\n' + ',\n'.join(pad + i for i in items) + '}'
    if isinstance(value, (list, tuple)):
        parts = [_format_value(v, indent + 1) for v in value]
        open_, close = ('[', ']') if isinstance(value, list) else ('(', ')')
        if isinstance(value, tuple) and len(value) == 1:
            close = ',)'
        one_line = open_ + ', '.join(parts) + close
        if len(one_line) + 4 * indent <= 80 and '\n' not in one_line:
            return one_line
        return open_ + '\n' + ',\n'.join(pad + p for p in parts) + close
    return repr(value)
