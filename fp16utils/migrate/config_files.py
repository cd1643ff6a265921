"""Config files: read an mmcv config (with its ``_base_`` files) and write one back.

:func:`load_config` reads a file as mmcv 1.x's ``Config.fromfile`` does (``{{ _base_.x }}``
references, ``{{ fileDirname }}`` and the other predefined variables, ``_delete_``,
``.json`` and, with PyYAML, ``.yaml`` files); :func:`format_config` writes a config dict
as a readable Python file that loads back equal.
"""

from __future__ import annotations

import builtins
import cmath
import importlib
import io
import json
import keyword
import os
import re
import tokenize
import types
import uuid
import warnings
from pathlib import Path
from typing import Any

from .convert import MigrationWarning
from .errors import CommandError, UsageError, short_repr, shown_path

__all__ = ['format_config', 'load_config']


def load_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a config file (its top-level values), merged onto its ``_base_`` files.

    A Python file is *executed*, as mmcv's ``Config.fromfile`` does: never load a config
    you do not trust. Bases are merged first, dicts recursively (``_delete_=True``
    replaces the base dict); ``{{ _base_.name }}``, ``{{ fileDirname }}`` and the other
    predefined variables, ``_deprecation_`` (a :class:`MigrationWarning`), ``.json`` and
    (with PyYAML) ``.yaml`` files are read as mmcv reads them.

    Args:
        path: The config file.

    Returns:
        The config as a dict.

    Raises:
        UsageError: The file does not exist or is not a file.
        CommandError: It or a ``_base_`` file cannot be read or run (``exit()``
            included), ``_base_`` is not file names, is missing, or is a cycle, or a
            ``{{ _base_.name }}`` names nothing in the bases.

    Example:
        >>> import pathlib, tempfile
        >>> f = pathlib.Path(tempfile.mkdtemp()) / 'c.py'
        >>> _ = f.write_text('fp16 = dict(loss_scale=512.)')
        >>> load_config(f)
        {'fp16': {'loss_scale': 512.0}}
    """
    loaded = _load_config(Path(path), ())
    return {k: v for k, v in loaded.items() if _is_config_value(k, v)}


def _load_config(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """One file merged onto its bases, every value kept (``_name`` ones too, as mmcv)."""
    named = shown_path(path)
    try:
        path = path.resolve()
    except (OSError, RuntimeError) as err:  # a symlink loop
        raise CommandError(f'{named}: cannot be resolved: {err}') from None
    if path in chain:
        raise CommandError(f'{shown_path(path)}: _base_ files include each other in a cycle')
    where = f'{shown_path(chain[-1])}: _base_ file {named}' if chain else named
    if not path.exists():
        if chain:
            raise CommandError(f'{where} does not exist')
        raise UsageError(f'{named}: no such config file')
    if not path.is_file():
        what = 'a directory' if path.is_dir() else 'not a regular file'
        problem = f'{where} is {what}; expected a Python config file'
        raise CommandError(problem) if chain else UsageError(problem)
    namespace, references = _read_config(path)
    _warn_deprecated(namespace.pop('_deprecation_', None), path)
    bases = namespace.pop('_base_', [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, (list, tuple)) or not all(isinstance(b, str) for b in bases):
        raise CommandError(f'{shown_path(path)}: _base_ must be a file name or a list of '
                           f'file names (str), got {short_repr(bases)}')
    merged: dict[str, Any] = {}
    for base in bases:
        merged = _merge(merged, _load_config(path.parent / base, (*chain, path)))
    own = {k: v for k, v in namespace.items()
           if not k.startswith('__') and not isinstance(v, _CODE_TYPES)}
    if references:
        own = _substitute(own, references, merged, path)
    return _merge(merged, own)


def _warn_deprecated(info: Any, path: Path) -> None:
    """mmcv's ``_deprecation_`` key: a :class:`MigrationWarning` with its message."""
    if info is None:
        return
    message = f'the config file {shown_path(path)} will be deprecated in the future.'
    if isinstance(info, dict) and 'expected' in info:
        message += f' Please use {info["expected"]} instead.'
    if isinstance(info, dict) and 'reference' in info:
        message += f' More information can be found at {info["reference"]}'
    warnings.warn(message, MigrationWarning, stacklevel=2)


#: mmcv's predefined variables, ``{{ fileDirname }}`` and the like.
_PREDEFINED = re.compile(r'\{\{\s*(fileDirname|fileBasename|fileBasenameNoExtension|fileExtname)'
                         r'\s*\}\}')
#: A reference to a value of the bases, ``{{ _base_.model.backbone }}``.
_BASE_REFERENCE = re.compile(r'\{\{\s*_base_\.([\w.]+)\s*\}\}')


def _read_config(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The top-level values of one file, and the placeholders its ``{{ _base_.x }}``
    references became (placeholder -> dotted name), as mmcv reads them."""
    shown = shown_path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CommandError(f'{shown}: cannot be read: {err.strerror or err}') from None
    kind = path.suffix.lower()
    references: dict[str, str] = {}
    if kind == '.py' and b'{{' not in data:
        return _run_config(path, data), references  # compile() reads the coding cookie
    try:
        encoding = 'utf-8' if kind != '.py' else tokenize.detect_encoding(
            io.BytesIO(data).readline)[0]
        text = data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        if kind == '.py':
            return _run_config(path, data), references  # the same error as without '{{'
        raise CommandError(f'{shown}: cannot be read as UTF-8 text') from None
    if '{{' in text:
        names = {'fileDirname': str(path.parent), 'fileBasename': path.name,
                 'fileBasenameNoExtension': path.stem, 'fileExtname': path.suffix}
        text = _PREDEFINED.sub(lambda m: names[m.group(1)].replace('\\', '/'), text)

        keys: dict[str, str] = {}  # dotted name -> its placeholder, one per name

        def placeholder(match: re.Match) -> str:
            name = match.group(1)
            if name not in keys:
                keys[name] = f'_{name}_{uuid.uuid4().hex[:6]}'
                references[keys[name]] = name
            return f'"{keys[name]}"'

        text = _BASE_REFERENCE.sub(placeholder, text)
    if kind == '.py':
        return _run_config(path, text), references
    if kind == '.json':
        try:
            loaded = json.loads(text)
        except ValueError as err:
            raise CommandError(f'{shown}: not valid JSON: {err}') from None
    elif kind in ('.yaml', '.yml'):
        loaded = _load_yaml(text, shown)
    else:
        raise CommandError(f'{shown}: a config must be a .py, .json, .yaml or .yml file, '
                           'as mmcv reads them')
    if not isinstance(loaded, dict):
        raise CommandError(f'{shown}: the file holds {type(loaded).__name__}, not a dict '
                           'of config keys')
    return loaded, references


def _load_yaml(text: str, shown: str) -> Any:
    """A YAML config, read with PyYAML (optional: mmcv reads YAML with it too)."""
    try:
        return importlib.import_module('yaml').safe_load(text)
    except ImportError:
        raise CommandError(f'{shown}: reading a YAML config needs PyYAML '
                           '(pip install pyyaml), as mmcv does') from None
    except Exception as err:  # noqa: BLE001 - yaml's errors have no common public base
        raise CommandError(f'{shown}: not valid YAML: {short_repr(err)}') from None


def _substitute(value: Any, references: dict[str, str], bases: dict[str, Any],
                path: Path) -> Any:
    """``value`` with each placeholder string replaced by the base value it names."""
    if isinstance(value, str) and value in references:
        found: Any = bases
        for key in references[value].split('.'):
            try:
                found = found[key]
            except (KeyError, IndexError, TypeError):
                raise CommandError(f'{shown_path(path)}: {{{{ _base_.{references[value]} }}}} '
                                   'names nothing in its _base_ files') from None
        return found
    if isinstance(value, dict):
        return {k: _substitute(v, references, bases, path) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_substitute(v, references, bases, path) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _run_config(path: Path, source: Any) -> dict[str, Any]:
    """Execute one Python config; every way it can fail becomes one CommandError."""
    shown = shown_path(path)
    namespace: dict[str, Any] = {'__name__': '__config__', '__file__': str(path),
                                 '__builtins__': builtins}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            exec(compile(source, str(path), 'exec'), namespace)  # noqa: S102 - a config file
    except SyntaxError as err:
        raise CommandError(f'{shown}:{err.lineno or 1}: syntax error: {err.msg}') from None
    except OSError as err:
        raise CommandError(f'{shown}: cannot be read: {err.strerror or err}') from None
    except SystemExit as err:
        raise CommandError(f'{shown}: could not be executed: it called exit({err.code!r})'
                           ) from None
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # the file is the user's code: report, do not crash
        raise CommandError(f'{shown}: could not be executed: {type(err).__name__}: '
                           f'{short_repr(err)}') from None
    return namespace


_FUNCTION_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
#: What mmcv leaves out of a Python config's values: modules and functions.
_CODE_TYPES = (types.ModuleType, types.FunctionType)


def _is_config_value(key: str, value: Any) -> bool:
    if key.startswith('_'):
        return False
    return not isinstance(value, _FUNCTION_TYPES)


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
    """Write a config dict as a readable Python config file that loads back equal.

    ``dict(key=value)`` where the keys are names, ``{...}`` otherwise; values must be
    literals (None, bool, numbers, str, bytes, and lists, tuples, dicts and sets of
    them); inf and nan are written ``float('inf')``, ``float('nan')``. The text is
    loaded back and compared with ``cfg`` before it is returned.

    Args:
        cfg: The config; its keys must be identifiers that are not keywords.

    Returns:
        The text of the config file.

    Raises:
        ValueError: Naming the key whose value is not a literal (a class, a function,
            ...), or when the text would not load back equal.

    Example:
        >>> print(format_config({'optim_wrapper': {'type': 'AmpOptimWrapper'}}), end='')
        optim_wrapper = dict(type='AmpOptimWrapper')
    """
    for key in cfg:
        if not _key_is_name(key):
            raise ValueError(f'{short_repr(key)}: a top-level config key must be a Python name '
                             '(an identifier that is not a keyword); rename it')
        if key == '__builtins__':
            raise ValueError(f'{key}: not a config key; rename it')
    try:
        for key, value in cfg.items():
            _check_literal(value, key)
        lines = [f'{key} = {_format_value(value, 0)}' for key, value in cfg.items()]
    except RecursionError:
        raise ValueError('the config nests too deeply to be written as a file') from None
    text = '\n'.join(lines) + '\n'
    _check_loads_back(text, cfg)
    return text


#: The most keys a dict is written with as ``dict(key=value, ...)``.
_MAX_KEYWORDS = 255
#: Values written with their repr (exact types: a subclass may repr as anything).
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
#: The names a written config may call, and all its check may run.
_LOAD_NAMES = {'dict': dict, 'set': set, 'frozenset': frozenset, 'float': float,
               'complex': complex}


def _check_literal(value: Any, where: str) -> None:
    """Raise ValueError naming ``where`` unless ``value`` can be written as a literal."""
    if type(value) in _SCALARS:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_literal(k, f'{where}[{short_repr(k)}]')
            _check_literal(v, f'{where}.{k}' if isinstance(k, str) else f'{where}[{k!r}]')
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for i, v in enumerate(value):
            _check_literal(v, f'{where}[{i}]')
        return
    raise ValueError(f'{where}: {short_repr(value)} ({type(value).__name__}) cannot be written as '
                     'a literal in a config file; write it as a string or a plain value')


def _check_loads_back(text: str, cfg: dict[str, Any]) -> None:
    """Parse and run ``text`` (names: dict, set, frozenset only); raise unless equal to cfg."""
    namespace: dict[str, Any] = {'__builtins__': dict(_LOAD_NAMES)}
    try:
        exec(compile(text, '<config>', 'exec'), namespace)  # noqa: S102 - our own text
    except (SyntaxError, RecursionError, MemoryError, ValueError) as err:
        raise ValueError(f'the written config would not load back ({type(err).__name__}: '
                         f'{short_repr(err)}); nothing was written') from None
    del namespace['__builtins__']
    if namespace.keys() != cfg.keys() or not all(_same(namespace[k], cfg[k]) for k in cfg):
        differ = [k for k in cfg if k not in namespace or not _same(namespace[k], cfg[k])]
        raise ValueError(f'{", ".join(differ) or "the config"}: the written config would '
                         'not load back to the same values; nothing was written')


def _same(a: Any, b: Any) -> bool:
    """``a == b``, where a nan equals a nan (a written ``float('nan')`` loads back as one)."""
    if type(a) is not type(b):
        return a == b
    if isinstance(a, (float, complex)):
        return all(x == y or x != x and y != y for x, y in zip(_parts(a), _parts(b)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _parts(value: complex) -> tuple[float, float]:
    return complex(value).real, complex(value).imag


def _number(value: float | complex) -> str:
    """A float or complex as config text; inf and nan as ``float('inf')`` and ``float('nan')``."""
    if cmath.isfinite(value):
        return repr(value)
    if isinstance(value, complex):
        return f'complex({_number(value.real)}, {_number(value.imag)})'
    return f"float('{value!r}')"


def _key_is_name(key: Any) -> bool:
    return isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)


def _format_value(value: Any, indent: int) -> str:
    pad = '    ' * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return 'dict()'
        # dict(k=...) reads best; past _MAX_KEYWORDS keys a {...} literal, which CPython
        # compiles in linear time (its keyword-argument check is quadratic).
        if len(value) <= _MAX_KEYWORDS and all(_key_is_name(k) for k in value):
            items = [f'{k}={_format_value(v, indent + 1)}' for k, v in value.items()]
            one_line = f'dict({", ".join(items)})'
            if len(one_line) + 4 * indent <= 80 and '\n' not in one_line:
                return one_line
            return 'dict(\n' + ',\n'.join(pad + i for i in items) + ')'
        items = [f'{k!r}: {_format_value(v, indent + 1)}' for k, v in value.items()]
        return '{\n' + ',\n'.join(pad + i for i in items) + '}'
    if isinstance(value, (set, frozenset)):
        inner = ', '.join(_format_value(v, indent + 1) for v in value)
        text = f'{{{inner}}}' if value else 'set()'
        return text if isinstance(value, set) else f'frozenset({text if value else ""})'
    if isinstance(value, (list, tuple)):
        parts = [_format_value(v, indent + 1) for v in value]
        open_, close = ('[', ']') if isinstance(value, list) else ('(', ')')
        if isinstance(value, tuple) and len(value) == 1:
            close = ',)'
        one_line = open_ + ', '.join(parts) + close
        if len(one_line) + 4 * indent <= 80 and '\n' not in one_line:
            return one_line
        return open_ + '\n' + ',\n'.join(pad + p for p in parts) + close
    if type(value) in (float, complex):
        return _number(value)
    return repr(value)
