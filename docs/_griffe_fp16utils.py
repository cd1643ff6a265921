"""Docstrings as the site shows them: the package's reST roles and ``Example:`` sections.

The package's docstrings are Google style with reST inline roles
(``:class:`OptimWrapper```, ``:func:`~fp16utils.find_overflow```) and an
``Example:`` section (singular), which help() and the doctests read as they are.
For the site, this griffe extension rewrites each docstring before it is parsed:

- ``Example:`` becomes ``Examples:``, so the ``>>>`` lines render as code;
- a role that names an object documented on an API page (a ``::: name`` line of
  docs/reference/api/*.md) becomes a link to it; any other role becomes inline code;
- a parameter default that is a private sentinel (``loss_scale=_UNSET``) shows what
  ``help()`` shows: the sentinel's repr, which says what the default means.

mkdocs.yml loads it (``extensions:`` of the python handler); it is not a page.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any, Dict, Optional

import griffe

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


def runtime_default(path: str, name: str) -> Optional[str]:
    """The repr of the default of parameter ``name`` of the function at ``path``, or None.

    Imports the module (the docs are built where the package's dependencies are);
    None where that fails, and the source text stays.
    """
    parts = path.split('.')
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module('.'.join(parts[:split]))
        except ImportError:
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
            default = inspect.signature(obj).parameters[name].default
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return None if default is inspect.Parameter.empty else repr(default)
    return None


class Fp16utilsDocstrings(griffe.Extension):
    """Rewrites each docstring of the package as :func:`rewrite` says."""

    def __init__(self) -> None:
        super().__init__()
        self.targets = documented()

    def on_function_instance(self, *, func: Any, **kwargs: Any) -> None:
        for parameter in func.parameters:
            if re.fullmatch(r'_\w+', str(parameter.default)):
                shown = runtime_default(func.path, parameter.name)
                if shown is not None:
                    parameter.default = shown

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = getattr(obj, 'docstring', None)
        if docstring is not None and obj.path.startswith('fp16utils'):
            docstring.value = rewrite(docstring.value, self.targets)
