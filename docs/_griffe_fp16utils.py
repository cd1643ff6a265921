"""Docstrings as the site shows them: the package's reST roles and ``Example:`` sections.

The package's docstrings are Google style with reST inline roles
(``:class:`OptimWrapper```, ``:func:`~fp16utils.find_overflow```) and an
``Example:`` section (singular), which help() and the doctests read as they are.
For the site, this griffe extension rewrites each docstring before it is parsed:

- ``Example:`` becomes ``Examples:``, so the ``>>>`` lines render as code;
- a role that names an object documented on an API page (a ``::: name`` line of
  docs/reference/api/*.md) becomes a link to it; any other role becomes inline code;
- a parameter default that is a private sentinel (``loss_scale=_UNSET``) shows what
  ``help()`` shows: the sentinel's repr, which says what the default means (read from
  the source, never imported).

mkdocs.yml loads it (``extensions:`` of the python handler); it is not a page.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Dict, Optional

try:
    import griffe
except ImportError:  # the docs tools are missing: the functions still work (tests)
    griffe = None

_API = Path(__file__).resolve().parent / 'reference' / 'api'
_ROLE = re.compile(r':(?:class|func|meth|attr|data|mod|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`')
_EXAMPLE = re.compile(r'^(?P<indent>[ \t]*)Example:[ \t]*$', re.M)


def documented() -> Dict[str, str]:
    """Every identifier rendered by a ``:::`` line, by full name and by last component."""
    targets: Dict[str, str] = {}
    for page in sorted(_API.glob('*.md')):
        for name in re.findall(r'^::: ([\w.]+)\s*$', page.read_text(), re.M):
            targets[name] = name
            targets.setdefault(name.rsplit('.', 1)[-1], name)
    return targets


def rewrite(text: str, targets: Dict[str, str]) -> str:
    """``text`` with ``Example:`` as ``Examples:`` and each role as a link or code.

    Example:
        >>> rewrite('See :class:`~fp16utils.scaler.LossScaler` and :meth:`step`.',
        ...         {'fp16utils.LossScaler': 'fp16utils.LossScaler'})
        'See [`LossScaler`][fp16utils.LossScaler] and `step`.'
    """
    def role(match: re.Match[str]) -> str:
        target = match.group('target').strip()
        shown = target.rsplit('.', 1)[-1] if match.group('tilde') else target
        full = target if target.startswith('fp16utils.') else f'fp16utils.{target}'
        identifier = targets.get(full) or targets.get(target)
        if identifier is None and target.startswith('fp16utils.'):
            # fp16utils.optim.AmpOptimWrapper: the public name documented as fp16utils.X
            identifier = targets.get(f'fp16utils.{target.rsplit(".", 1)[-1]}')
        return f'[`{shown}`][{identifier}]' if identifier else f'`{shown}`'

    return _EXAMPLE.sub(r'\g<indent>Examples:', _ROLE.sub(role, text))


def sentinel_repr(source: str, name: str) -> Optional[str]:
    """What ``repr()`` of the module-level sentinel ``name`` gives, read from ``source``.

    The sentinel must be ``name = SomeClass()`` (annotated or not) with
    ``SomeClass.__repr__`` returning one string literal; None otherwise. Nothing is
    imported: the site builds where torch is not installed.

    Example:
        >>> sentinel_repr("class _D:\\n    def __repr__(self):\\n        return '<d>'\\n"
        ...               "_UNSET = _D()\\n", '_UNSET')
        '<d>'
    """
    tree = ast.parse(source)
    made = None
    for node in tree.body:
        target = getattr(node, 'target', None) or (node.targets[0] if isinstance(
            node, ast.Assign) and len(node.targets) == 1 else None)
        value = getattr(node, 'value', None)
        if (isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)):
            made = value.func.id
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == made:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == '__repr__':
                    returns = [n for n in ast.walk(item) if isinstance(n, ast.Return)]
                    if len(returns) == 1 and isinstance(returns[0].value, ast.Constant) and (
                            isinstance(returns[0].value.value, str)):
                        return returns[0].value.value
    return None


#: Where mmcv's defaults live, each once; a signature names them, the site shows the value.
DEFAULTS_MODULE = Path(__file__).resolve().parents[1] / 'fp16utils' / '_args' / 'spec.py'


def constant_source(source: str, name: str) -> Optional[str]:
    """The expression assigned to the module-level constant ``name`` in ``source``, when it
    is made of literals and arithmetic only (``2**32``, ``512.0``); None otherwise.

    Example:
        >>> constant_source('N = 2**32\\nM = f()\\n', 'N'), constant_source('M = f()', 'M')
        ('2**32', None)
    """
    for node in ast.parse(source).body:
        target = getattr(node, 'target', None) or (node.targets[0] if isinstance(
            node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == name and all(
                isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator,
                               ast.unaryop)) for n in ast.walk(node.value)):
            return ast.get_source_segment(source, node.value)
    return None


if griffe is not None:
    class Fp16utilsDocstrings(griffe.Extension):
        """Rewrites each docstring of the package as :func:`rewrite` says."""

        def __init__(self) -> None:
            super().__init__()
            self.targets = documented()
            self.shown: Dict[Any, Optional[str]] = {}  # (file, sentinel) -> its repr

        def on_function_instance(self, *, func: Any, **kwargs: Any) -> None:
            for parameter in func.parameters:
                if re.fullmatch(r'MMCV_[A-Z_]+', str(parameter.default)):
                    key = (DEFAULTS_MODULE, str(parameter.default))
                    if key not in self.shown:
                        self.shown[key] = constant_source(DEFAULTS_MODULE.read_text(), key[1])
                    if self.shown[key] is not None:
                        parameter.default = self.shown[key]
                elif re.fullmatch(r'_\w+', str(parameter.default)):
                    key = (func.module.filepath, str(parameter.default))
                    if key not in self.shown:  # each module read and parsed once
                        self.shown[key] = sentinel_repr(Path(key[0]).read_text(), key[1])
                    if self.shown[key] is not None:
                        parameter.default = self.shown[key]

        def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
            docstring = getattr(obj, 'docstring', None)
            if docstring is not None and obj.path.startswith('fp16utils'):
                docstring.value = rewrite(docstring.value, self.targets)
