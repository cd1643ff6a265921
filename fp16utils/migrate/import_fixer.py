"""Rewrite the imports of the 0.x fp16 names to fp16utils: :func:`fix_imports`.

Only import statements change, at the token level; the rest of a file (comments,
formatting, encoding, line endings) stays byte for byte.
"""

from __future__ import annotations

import ast
import difflib
import io
import os
import tokenize
from dataclasses import dataclass
from typing import Optional

from ._atomic import atomic_write
from ._source_files import (
    FP16_NAMES,
    Source,
    alias_text,
    is_mm_module,
    iter_python_files,
    load_source,
    os_reason,
)

__all__ = ['FileChange', 'fix_imports']


@dataclass(frozen=True)
class FileChange:
    """What :func:`fix_imports` did (or, with ``dry_run``, would do) to one file.

    Attributes:
        path: the file.
        diff: a unified diff of the change ('' when nothing changes).
        changed: whether the file's content changes.
        error: why the file was skipped (not read, decoded, parsed or written), else None.

    Example:
        >>> import pathlib, tempfile
        >>> f = pathlib.Path(tempfile.mkdtemp()) / 'm.py'
        >>> _ = f.write_text('from mmcv.runner import force_fp32' + chr(10))
        >>> [(c.changed, c.error) for c in fix_imports(f, dry_run=True)]
        [(True, None)]
    """

    path: str
    diff: str
    changed: bool
    error: Optional[str] = None


@dataclass
class _Alias:
    text: str
    start: int  # offsets into the file text
    end: int
    comma_end: Optional[int]  # end of the comma that follows, if any
    row: int  # the file line (1-based) the alias starts on
    end_row: int


def _import_layout(
    src: Source, node: ast.ImportFrom
) -> tuple[tuple[int, int], list[_Alias], bool]:
    """Token-level layout of a ``from X import ...``: module span, aliases, parenthesized."""
    start = src.offset(node.lineno, node.col_offset)
    end = src.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
    segment = src.text[start:end]

    def absolute(row: int, col: int) -> int:
        return start + col if row == 1 else src.starts[node.lineno - 2 + row] + col

    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(segment, newline='').readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER)
    ]
    i = 1  # after 'from'
    mod_start = absolute(*tokens[i].start)
    while not (tokens[i].type == tokenize.NAME and tokens[i].string == 'import'):
        i += 1
    mod_end = absolute(*tokens[i - 1].end)
    i += 1
    paren = tokens[i].string == '('
    if paren:
        i += 1
    aliases: list[_Alias] = []
    while i < len(tokens) and tokens[i].string != ')':
        first = tokens[i]
        parts = [first.string]
        last = first
        i += 1
        if i < len(tokens) and tokens[i].string == 'as':
            parts += ['as', tokens[i + 1].string]
            last = tokens[i + 1]
            i += 2
        comma_end = None
        if i < len(tokens) and tokens[i].string == ',':
            comma_end = absolute(*tokens[i].end)
            i += 1
        aliases.append(
            _Alias(
                ' '.join(parts),
                absolute(*first.start),
                absolute(*last.end),
                comma_end,
                node.lineno + first.start[0] - 1,
                node.lineno + last.end[0] - 1,
            )
        )
    return (mod_start, mod_end), aliases, paren


def _line_eol(line: str) -> str:
    for eol in ('\r\n', '\n', '\r'):
        if line.endswith(eol):
            return eol
    return ''


def _split_edits(
    src: Source, node: ast.ImportFrom, fp16: list[ast.alias]
) -> list[tuple[int, int, str]]:
    """Edits that move the fp16 names of a mixed import to a new fp16utils import."""
    _, aliases, paren = _import_layout(src, node)
    move = {alias_text(a) for a in fp16}
    edits: list[tuple[int, int, str]] = []
    start = src.offset(node.lineno, node.col_offset)
    end = src.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
    end_line_no = node.end_lineno or node.lineno
    multi_line = end_line_no != node.lineno
    new_import = 'from fp16utils import ' + ', '.join(alias_text(a) for a in fp16)

    if multi_line and (not paren or any(a.row != a.end_row for a in aliases)):
        # Backslash continuations (no comment can sit inside them) or a name split
        # over lines: write the remaining import on one line.
        kept = ', '.join(a.text for a in aliases if a.text not in move)
        edits.append((start, end, f'from {node.module} import {kept}'))
    else:
        rows: dict[int, list[_Alias]] = {}
        for alias in aliases:
            rows.setdefault(alias.row, []).append(alias)
        for row, on_line in rows.items():
            if not any(a.text in move for a in on_line):
                continue
            kept = [a for a in on_line if a.text not in move]
            first, last = on_line[0], on_line[-1]
            tail = last.comma_end if last.comma_end is not None else last.end
            line = src.lines[row - 1]
            line_start = src.starts[row - 1]
            prefix = src.text[line_start : first.start]
            suffix = src.text[tail : line_start + len(line)]
            suffix_code = suffix.split('#', 1)[0]
            if kept:
                later_kept = any(a.row > row and a.text not in move for a in aliases)
                comma = ',' if last.comma_end is not None or later_kept else ''
                edits.append((first.start, tail, ', '.join(a.text for a in kept) + comma))
            elif not prefix.strip() and not suffix_code.strip():
                # Only moved names on this line: drop it, keeping a comment if any.
                comment = suffix[len(suffix_code) :].rstrip('\r\n')
                kept_line = f'{prefix}{comment}{_line_eol(line)}' if comment else ''
                edits.append((line_start, line_start + len(line), kept_line))
            else:
                edits.append((first.start, tail, ''))

    first_line = src.lines[node.lineno - 1]
    end_line = src.lines[end_line_no - 1]
    indent = first_line[: len(first_line) - len(first_line.lstrip(' \t'))]
    line_before = src.text[src.starts[node.lineno - 1] : start]
    rest = src.text[end : src.starts[end_line_no - 1] + len(end_line)].strip()
    if not line_before.strip() and (not rest or rest.startswith('#')):
        eol = _line_eol(end_line)
        if eol:
            at = src.starts[end_line_no]
            edits.append((at, at, f'{indent}{new_import}{eol}'))
        else:  # last line of the file, without a line ending
            fallback = next((_line_eol(x) for x in src.lines if _line_eol(x)), '\n')
            at = src.starts[end_line_no - 1] + len(end_line)
            edits.append((at, at, f'{fallback}{indent}{new_import}'))
    else:  # shares its line with other statements: stay on that line
        edits.append((end, end, f'; {new_import}'))
    return edits


def _unified_diff(path: str, old: list[str], new: list[str]) -> str:
    out = []
    for line in difflib.unified_diff(old, new, fromfile=path, tofile=path):
        if not line.endswith(('\n', '\r')):
            line += '\n\\ No newline at end of file\n'
        out.append(line)
    return ''.join(out)


def _fix_file(path: str, dry_run: bool) -> FileChange:
    src, tree, why = load_source(path)
    if why is not None:
        return FileChange(path, '', False, why.message)
    assert src is not None and tree is not None
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.ImportFrom) and node.level == 0 and is_mm_module(node.module)
        ):
            continue
        fp16 = [a for a in node.names if a.name in FP16_NAMES]
        if not fp16:
            continue
        if len(fp16) == len(node.names):
            # Every name moves: swap the module name only, keeping the rest verbatim.
            (mod_start, mod_end), _, _ = _import_layout(src, node)
            edits.append((mod_start, mod_end, 'fp16utils'))
        else:
            edits.extend(_split_edits(src, node, fp16))
    if not edits:
        return FileChange(path, '', False)
    text = src.text
    for begin, finish, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:begin] + replacement + text[finish:]
    if text == src.text:
        return FileChange(path, '', False)
    new_lines = io.StringIO(text, newline='').readlines()
    diff = _unified_diff(path, src.lines, new_lines)
    if not dry_run:
        try:
            atomic_write(path, text.encode(src.encoding))
        except OSError as err:
            return FileChange(path, diff, False, f'could not be written: {os_reason(err)}')
    return FileChange(path, diff, True)


def fix_imports(path: str | os.PathLike[str], dry_run: bool = False) -> list[FileChange]:
    """Rewrite imports of the 0.x fp16 names from mm* packages to ``from fp16utils import``.

    An import of fp16 names only gets ``fp16utils`` for its module; one that mixes them
    with other names is split, the fp16 names moving to a new line after it. Module and
    star imports are left alone (:func:`scan` reports them). A second run changes
    nothing; each file is replaced atomically, a link written through.

    Args:
        path: a .py file or a folder (hidden folders, ``__pycache__`` and virtual
            environments are skipped).
        dry_run: compute the changes and their diffs but write nothing.

    Returns:
        One :class:`FileChange` per Python file looked at; files that cannot be read,
        decoded, parsed or written, and folders that cannot be listed, come back
        unchanged with ``error`` set.

    Raises:
        FileNotFoundError: ``path`` is neither a file nor a folder.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / 'm.py'
        >>> _ = f.write_text('from mmcv.runner import BaseModule, auto_fp16  # noqa\\n')
        >>> [c.changed for c in fix_imports(f)]
        [True]
        >>> print(f.read_text(), end='')
        from mmcv.runner import BaseModule  # noqa
        from fp16utils import auto_fp16
    """
    changes: list[FileChange] = []

    def folder_error(err: OSError) -> None:
        where = os.fsdecode(err.filename or os.fspath(path))
        changes.append(FileChange(where, '', False, f'cannot list the folder: {os_reason(err)}'))

    for file in iter_python_files(os.fspath(path), onerror=folder_error):
        changes.append(_fix_file(file, dry_run))
    return changes
