"""What the scanner and the import fixer share: the 0.x names, and source files read.

The mm* packages and fp16 names they look for, the walk over a source tree, and a
file's text kept as written (encoding, line endings) with ast positions mapped onto it.
"""

from __future__ import annotations

import ast
import io
import os
import stat
import tokenize
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

#: Top-level packages of the 0.x OpenMMLab codebases.
MM_PACKAGES = frozenset(
    {
        'mmaction',
        'mmcls',
        'mmcv',
        'mmdet',
        'mmdet3d',
        'mmedit',
        'mmfewshot',
        'mmflow',
        'mmgen',
        'mmhuman3d',
        'mmocr',
        'mmpose',
        'mmrazor',
        'mmrotate',
        'mmseg',
        'mmselfsup',
        'mmtrack',
    }
)

#: The 0.x fp16 names that fp16utils provides with the same behaviour.
FP16_NAMES = frozenset(
    {
        'auto_fp16',
        'force_fp32',
        'wrap_fp16_model',
        'LossScaler',
        'Fp16OptimizerHook',
        'GradientCumulativeFp16OptimizerHook',
        'cast_tensor_type',
        'patch_norm_fp32',
        'patch_forward_method',
    }
)
#: The last part of the name of an mm* module that holds the fp16 names.
FP16_MODULE_LEAVES = frozenset({'fp16_utils', 'fp16'})
_VENV_DIR_NAMES = frozenset({'venv', 'virtualenv', 'site-packages', 'node_modules'})


def is_mm_module(module: Optional[str]) -> bool:
    """Whether ``module`` belongs to one of the 0.x OpenMMLab packages."""
    return bool(module) and module.split('.')[0] in MM_PACKAGES  # type: ignore[union-attr]


def is_fp16_module(module: str) -> bool:
    """Whether ``module`` is an mm* module that holds the 0.x fp16 names."""
    return is_mm_module(module) and module.split('.')[-1] in FP16_MODULE_LEAVES


def alias_text(alias: ast.alias) -> str:
    """An imported name as written: ``name`` or ``name as other``."""
    return alias.name if alias.asname is None else f'{alias.name} as {alias.asname}'


def os_reason(err: OSError) -> str:
    """The words of an OSError without its errno and path: ``Permission denied``."""
    return err.strerror or str(err)


def iter_python_files(
    path: str, onerror: Optional[Callable[[OSError], None]] = None
) -> Iterator[str]:
    """The .py files under ``path``, sorted; hidden, cache, venv and linked folders skipped."""
    if os.path.isfile(path):
        yield path
        return
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f'{path!r} is neither a file nor a directory; pass a .py file or a source folder'
        )
    for root, dirs, files in os.walk(path, onerror=onerror):
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith('.')
            and d != '__pycache__'
            and d not in _VENV_DIR_NAMES
            and not os.path.exists(os.path.join(root, d, 'pyvenv.cfg'))
        )
        for name in sorted(files):
            if name.endswith('.py'):
                yield os.path.join(root, name)


class Source:
    """A Python file's text, decoded as Python would, with its encoding and lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
            raise OSError(22, 'not a regular file', path)
        with open(path, 'rb') as fh:
            self.raw = fh.read()
        self.encoding, _ = tokenize.detect_encoding(io.BytesIO(self.raw).readline)
        self.text = self.raw.decode(self.encoding)
        # Universal newlines, as the tokenizer sees them, but keep each line's ending.
        self.lines = io.StringIO(self.text, newline='').readlines()
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def char_col(self, lineno: int, byte_col: int) -> int:
        """0-based character column of an ast (UTF-8 byte) column."""
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ''
        return len(line.encode('utf-8')[:byte_col].decode('utf-8', errors='replace'))

    def offset(self, lineno: int, byte_col: int) -> int:
        """Index into ``text`` of an ast position."""
        return self.starts[lineno - 1] + self.char_col(lineno, byte_col)


@dataclass(frozen=True)
class Unreadable:
    """Why a file was skipped: it cannot be read, does not decode or does not parse."""

    line: int  # 1-based; 1 when the file does not decode
    col: int  # 1-based
    message: str  # what went wrong
    suggestion: str  # what to do about it
    kind: str = 'syntax-error'  # or 'unreadable': not read, not decoded, or nested too deeply


def load_source(
    path: str,
) -> tuple[Optional[Source], Optional[ast.Module], Optional[Unreadable]]:
    """``(source, tree, None)``, or why not: ``(None, None, why)`` / ``(source, None, why)``."""
    try:
        src = Source(path)
    except OSError as exc:
        return None, None, unreadable(f'cannot read the file: {os_reason(exc)}')
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        return (
            None,
            None,
            Unreadable(
                1,
                1,
                f'cannot decode the file: {exc}',
                'fix the file encoding (or its coding: line); the file was skipped',
                'unreadable',
            ),
        )
    try:
        tree = ast.parse(src.text, filename=path)
    except (RecursionError, MemoryError):
        return src, None, unreadable(TOO_DEEP)
    except (SyntaxError, ValueError) as exc:
        if str(getattr(exc, 'msg', '')).startswith('too many nested'):  # the parser's limit
            return src, None, unreadable(TOO_DEEP)
        line = getattr(exc, 'lineno', None) or 1
        col = getattr(exc, 'offset', None) or 1
        msg = getattr(exc, 'msg', None) or str(exc)
        return (
            src,
            None,
            Unreadable(
                line,
                col,
                f'cannot parse the file: {msg}',
                'fix the syntax error and scan again; the file was skipped',
            ),
        )
    return src, tree, None


#: Why a file whose expressions nest too deeply for Python's parser was skipped.
TOO_DEEP = 'cannot parse the file: its expressions nest too deeply for the Python parser'


def unreadable(message: str, line: int = 1) -> Unreadable:
    """An ``unreadable`` reason: the file (or folder) was skipped and must be looked at."""
    return Unreadable(line, 1, message, 'check it by hand: it was skipped', 'unreadable')


def dotted_name(node: ast.AST) -> Optional[str]:
    """``'a.b.c'`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return '.'.join(reversed(parts))
    return None
