"""Read a C++/CUDA extension's sources for the dtypes its kernels are compiled for.

Standard library only; nothing is compiled or imported. A kernel's dtypes are read from
ATen's dispatch macros (``AT_DISPATCH_FLOATING_TYPES`` has float and double instances,
``..._AND_HALF`` adds float16, ``..._AND2(at::kHalf, at::kBFloat16, ...)`` names its
extra types) or, where a function reads ``data_ptr<float>()`` with no dispatch, float
only. Functions are found by their top-level definitions, so a call can be followed from
an extension's entry point to the kernel that dispatches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

__all__ = ['Dispatch', 'FunctionIndex', 'dispatch_dtypes', 'read_functions']

#: What a dispatch that reads float only (no macro) is called in the evidence.
FIXED_FLOAT = 'float only (no AT_DISPATCH)'
#: The low-precision dtypes looked for, by the words that name them in a macro.
_LOW = {'float16': ('Half', 'kHalf'), 'bfloat16': ('BFloat16', 'kBFloat16')}
_NOT_FUNCTIONS = frozenset({'if', 'for', 'while', 'switch', 'catch', 'return', 'sizeof',
                            'namespace', 'struct', 'class', 'union', 'enum', 'decltype'})
_COMMENTS_AND_STRINGS = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_PREPROCESSOR = re.compile(r'^[ \t]*#(?:[^\n]*\\\n)*[^\n]*', re.M)
_DEFINITION = re.compile(r'(\w+)\s*\([^{};]*\)\s*(?:const\s*)?(?:noexcept\s*)?'
                         r'(?:->\s*[\w:<>]+\s*)?(?::[^{};]*)?$')
_MACRO = re.compile(r'\b(AT_DISPATCH_\w+)\s*\(')
_CALL = re.compile(r'\b([A-Za-z_]\w*)\s*(?:<[^<>;{}()]*>\s*)?\(')
_FIXED = re.compile(r'\bdata_ptr\s*<\s*float\s*>|\w+\s*<\s*float\s*>\s*\(|'
                    r'\busing\s+scalar_t\s*=\s*float\s*;|\btypedef\s+float\s+scalar_t\s*;')


@dataclass(frozen=True)
class Dispatch:
    """One place a kernel's dtypes are decided.

    Attributes:
        file: the source file, relative to the folder read (``pytorch/cpu/nms.cpp``).
        function: the function that holds the dispatch.
        macro: the macro as evidence: ``AT_DISPATCH_FLOATING_TYPES_AND_HALF``,
            ``AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16)``, or
            ``float only (no AT_DISPATCH)`` for a kernel that reads float without one.
    """

    file: str
    function: str
    macro: str

    @property
    def dtypes(self) -> frozenset:
        """The low-precision dtypes (``float16``, ``bfloat16``) it has kernels for."""
        return dispatch_dtypes(self.macro)


def dispatch_dtypes(macro: str) -> frozenset:
    """The low-precision dtypes a dispatch macro (as :class:`Dispatch` spells it) covers.

    Args:
        macro: ``AT_DISPATCH_FLOATING_TYPES_AND_HALF``, ``AT_DISPATCH_FLOATING_TYPES_AND(
            Half)``, ``float only (no AT_DISPATCH)``, ...

    Returns:
        A frozenset of ``'float16'`` and ``'bfloat16'``: the ones it has kernels for.

    Example:
        >>> sorted(dispatch_dtypes('AT_DISPATCH_FLOATING_TYPES_AND_HALF'))
        ['float16']
    """
    name, _, extra = macro.partition('(')
    words = set(re.findall(r'\w+', extra))
    found = set()
    if 'HALF' in name or 'REDUCED_FLOATING' in name or words & set(_LOW['float16']):
        found.add('float16')
    if 'BFLOAT16' in name or 'REDUCED_FLOATING' in name or words & set(_LOW['bfloat16']):
        found.add('bfloat16')
    return frozenset(found)


def _macro_label(name: str, args: str) -> Optional[str]:
    """The evidence label of one macro use; None for one that dispatches no float type."""
    if name == 'AT_DISPATCH_V2':  # (dtype, name, lambda, the types...)
        if 'FLOATING' not in args and 'kFloat' not in args:
            return None
        extra = args
    elif 'FLOATING' not in name and 'ALL_TYPES' not in name:
        return None  # integral, complex only, ...
    else:  # the extra types come before the dtype argument
        extra = args.split('scalar_type', 1)[0]
    low = [short for short, words in (('Half', _LOW['float16']), ('BFloat16', _LOW['bfloat16']))
           if set(re.findall(r'\w+', extra)) & set(words)]
    if re.search(r'_AND\d*$', name) or name == 'AT_DISPATCH_V2':
        return f'{name}({", ".join(low)})'
    return name


@dataclass
class _Function:
    name: str
    file: str
    body: str


class FunctionIndex:
    """The top-level function definitions of a set of C++/CUDA files, by name.

    Args:
        root: the folder the file names are given relative to.
        files: the files to read.
    """

    def __init__(self, root: Path, files: Iterable[Path]) -> None:
        self.functions: dict[str, list[_Function]] = {}
        for path in sorted(files):
            rel = path.relative_to(root).as_posix()
            for name, body in read_functions(path.read_text(encoding='utf-8', errors='replace')):
                self.functions.setdefault(name, []).append(_Function(name, rel, body))

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def calls(self, name: str) -> list:
        """The names called by the function(s) ``name`` that this index defines."""
        called = []
        for fn in self.functions.get(name, ()):
            for callee in _CALL.findall(fn.body):
                if callee in self.functions and callee != name and callee not in called:
                    called.append(callee)
        return called

    def dispatches(self, entry: str, depth: int = 6) -> list:
        """The float dispatches reached from the function ``entry`` through this index.

        Each function reached contributes its macros; a function reached that reads
        ``data_ptr<float>`` (instantiates a template ``<float>``, or sets ``scalar_t``
        to float) and dispatches nothing, where nothing it calls dispatches either,
        contributes ``float only (no AT_DISPATCH)``.
        """
        found: list[Dispatch] = []
        seen: set[str] = set()

        def walk(name: str, left: int) -> bool:
            if name in seen or left < 0:
                return False
            seen.add(name)
            own = False
            for fn in self.functions.get(name, ()):
                for match in _MACRO.finditer(fn.body):
                    label = _macro_label(match.group(1), fn.body[match.end():match.end() + 200])
                    if label is not None:
                        _add(found, Dispatch(fn.file, fn.name, label))
                        own = True
            below = [walk(callee, left - 1) for callee in self.calls(name)]
            if own or any(below):
                return True
            for fn in self.functions.get(name, ()):
                if _FIXED.search(fn.body):
                    _add(found, Dispatch(fn.file, fn.name, FIXED_FLOAT))
                    return True
            return False

        walk(entry, depth)
        return found


def _add(found: list, item: Dispatch) -> None:
    if item not in found:
        found.append(item)


def _clean(text: str) -> str:
    """The source without comments, string/char literals and preprocessor lines
    (each replaced by spaces or an empty literal, so braces stay balanced)."""
    def blank(match: re.Match) -> str:
        token = match.group(0)
        if token.startswith(('"', "'")):
            return token[0] * 2
        return ' ' if token.startswith('//') else '\n' * token.count('\n') + ' '
    return _PREPROCESSOR.sub('', _COMMENTS_AND_STRINGS.sub(blank, text))


def read_functions(text: str) -> list:
    """``(name, body)`` of each function defined outside any other function's body.

    Definitions inside namespaces, ``extern "C"`` blocks and classes count; lambdas and
    control blocks inside a body do not. Preprocessor branches are all kept.

    Args:
        text: C++ or CUDA source.

    Returns:
        A list of ``(name, body)``, the body without comments or string literals.

    Example:
        >>> read_functions('namespace a { int f(int x) { if (x) { return 1; } return 0; } }')
        [('f', ' if (x) { return 1; } return 0; ')]
    """
    text = _clean(text)
    found: list = []
    stack: list = []  # per open brace: (function name or None, body start)
    header_start = 0
    for pos, char in enumerate(text):
        if char in ';':
            if not any(name for name, _ in stack):
                header_start = pos + 1
        elif char == '{':
            inside = any(name for name, _ in stack)
            name = None
            if not inside:
                match = _DEFINITION.search(text[header_start:pos].strip())
                if match and match.group(1) not in _NOT_FUNCTIONS:
                    name = match.group(1)
            stack.append((name, pos + 1))
            if not inside:
                header_start = pos + 1
        elif char == '}':
            if not stack:
                continue  # unbalanced (a preprocessor branch): ignore
            name, start = stack.pop()
            if name is not None:
                found.append((name, text[start:pos]))
            if not any(n for n, _ in stack):
                header_start = pos + 1
    return found
