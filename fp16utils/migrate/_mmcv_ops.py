"""Read an mmcv installation's ops, Python and C++, into the half-kernel table's raw form.

Standard library only; mmcv and torch are never imported. The Python side
(``mmcv/ops/*.py``, read with :mod:`ast`) says which compiled functions (``ext_module.
<name>``) each public op reaches and which config ``type`` names build it; the C++ side
(``mmcv/ops/csrc``) says, per device, which dispatch decides the dtypes of the kernels
behind each compiled function. :func:`read_mmcv_ops` gives two dicts, the same shape
as the table shipped for mmcv 1.7.2 (:mod:`._mmcv172_kernels`) decodes to.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, Optional

from ._csrc import FunctionIndex

__all__ = ['DEVICES', 'read_mmcv_ops', 'read_ops_csrc', 'read_ops_python']

#: The devices whose kernels are read, and the folders under csrc/pytorch that hold them.
DEVICES = ('cpu', 'cuda')
_REGISTER = re.compile(r'REGISTER_DEVICE_IMPL\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)')
_PYBIND = re.compile(r'\.def\(\s*"(\w+)"\s*,\s*&\s*(\w+)')


def _sources(folder: Path, suffixes: tuple) -> list:
    return sorted(p for p in folder.rglob('*') if p.suffix in suffixes and p.is_file())


def read_ops_csrc(csrc: Path) -> dict:
    """Per compiled function of mmcv's ``_ext``, the dispatches of its kernels per device.

    Args:
        csrc: mmcv's ``ops/csrc`` folder.

    Returns:
        ``{name: ((device, file, function, macro), ...)}`` for each function bound in
        ``pytorch/pybind.cpp`` whose kernels dispatch a float type somewhere; files are
        relative to ``csrc``.
    """
    pytorch = csrc / 'pytorch'
    top = FunctionIndex(csrc, [p for p in pytorch.glob('*.cpp') if p.is_file()])
    devices = {dev: FunctionIndex(csrc, _sources(pytorch / dev, ('.cpp', '.cu', '.cuh')))
               for dev in DEVICES if (pytorch / dev).is_dir()}
    registered: dict = {}
    for path in _sources(pytorch, ('.cpp', '.cu')):
        for impl, dev, fn in _REGISTER.findall(path.read_text(encoding='utf-8',
                                                              errors='replace')):
            registered.setdefault((impl, dev.lower()), []).append(fn)
    pybind = pytorch / 'pybind.cpp'
    bound = _PYBIND.findall(pybind.read_text(encoding='utf-8', errors='replace')
                            ) if pybind.is_file() else []
    table: dict = {}
    for name, entry in bound:
        reached = _reach(top, entry)
        kernels = []
        for dev, index in devices.items():
            roots = [fn for n in reached for fn in registered.get((n, dev), ())]
            roots += [n for n in reached if n in index]
            for root in dict.fromkeys(roots):
                for d in index.dispatches(root):
                    row = (dev, d.file, d.function, d.macro)
                    if row not in kernels:
                        kernels.append(row)
        if kernels:
            table[name] = tuple(kernels)
    return table


def _reach(top: FunctionIndex, entry: str, depth: int = 4) -> list:
    """``entry`` and every name it calls, through the functions of ``top``, in order.

    Names ``top`` does not define (a device function, a registered ``*_impl``) are
    listed but not followed.
    """
    order, todo = [entry], [(entry, depth)]
    while todo:
        name, left = todo.pop(0)
        if left == 0:
            continue
        for fn in top.functions.get(name, ()):
            for callee in re.findall(r'\b([A-Za-z_]\w*)\s*\(', fn.body):
                if callee not in order:
                    order.append(callee)
                    todo.append((callee, left - 1))
    return order


class _Module:
    """One ``mmcv/ops/<module>.py``: its top-level names, imports and compiled calls."""

    def __init__(self, tree: ast.Module) -> None:
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple] = {}  # local name -> (module, name)
        self.ext_vars: set[str] = set()
        for node in _top_level(tree.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs.setdefault(node.name, node)
                for item in node.body if isinstance(node, ast.ClassDef) else ():
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.defs.setdefault(f'{node.name}.{item.name}', item)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs.setdefault(target.id, node.value)
                        if _is_load_ext(node.value):
                            self.ext_vars.add(target.id)
            elif isinstance(node, ast.ImportFrom) and node.module:
                module = node.module.split('.')[-1] if (
                    node.level == 1 or node.module.startswith('mmcv.ops.')) else None
                for alias in node.names:
                    if module is not None:
                        self.imports[alias.asname or alias.name] = (module, alias.name)

    def resolve(self, name: str) -> Optional[tuple]:
        """``(module, name)`` a local name (``X`` or ``X.method``) stands for; None:
        this module's own."""
        head, dot, attr = name.partition('.')
        if head in self.imports and head not in self.defs:
            module, orig = self.imports[head]
            return module, orig + dot + attr
        return None

    def refs(self, name: str) -> tuple:
        """(names of this module or imported ones, compiled functions) ``name`` uses.

        ``X.method`` where X is a class stands for that method alone (a Function's
        ``_npu_forward`` does not bring in its compiled ``forward``); ``X`` for all of X.
        """
        node = self.defs.get(name)
        names, compiled, taken = set(), set(), set()
        if node is None:
            return names, compiled
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                if sub.value.id in self.ext_vars:
                    compiled.add(sub.attr)
                    taken.add(id(sub.value))
                elif self._is_method(f'{sub.value.id}.{sub.attr}'):
                    names.add(f'{sub.value.id}.{sub.attr}')
                    taken.add(id(sub.value))
            elif isinstance(sub, ast.Name) and id(sub) not in taken:
                names.add(sub.id)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                names.add(sub.value)  # ``eval(nms_type)`` in batched_nms
        known = {n for n in names if n.partition('.')[0] in self.defs or
                 n.partition('.')[0] in self.imports}
        return known, compiled

    def _is_method(self, name: str) -> bool:
        head = name.partition('.')[0]
        return isinstance(self.defs.get(head), ast.ClassDef) or self.resolve(name) is not None


def _top_level(body: list) -> Iterator[ast.stmt]:
    """The statements of a module, those inside top-level ``if``/``try`` blocks too."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)


def _is_load_ext(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
        node.func.attr == 'load_ext')


def _kind(node: ast.AST) -> str:
    """``module`` for a class that is not an autograd Function, else ``function``."""
    if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases]
        return 'function' if any(b.split('.')[-1] == 'Function' for b in bases) else 'module'
    return 'function'


def _registered_types(node: ast.AST) -> list:
    """The registry names a top-level class registers itself under (``'DCN'``)."""
    names = []
    for dec in getattr(node, 'decorator_list', ()):
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and (
                dec.func.attr == 'register_module'):
            given = [a.value for a in dec.args[:1] if isinstance(a, ast.Constant)]
            given += [k.value.value for k in dec.keywords
                      if k.arg == 'name' and isinstance(k.value, ast.Constant)]
            names.append(given[0] if given and isinstance(given[0], str) else node.name)
    return names


def read_ops_python(ops: Path) -> tuple:
    """The ops of ``mmcv/ops`` that reach compiled functions, and their config names.

    Args:
        ops: mmcv's ``ops`` folder.

    Returns:
        ``(OPS, CONFIG_TYPES)``: ``{name: (kind, (compiled function, ...))}`` for each
        public top-level name of an ops module (and each name ``ops/__init__.py``
        exports) that reaches one; ``{registry name: op name}``.
    """
    modules = {}
    for path in sorted(ops.glob('*.py')):
        try:
            modules[path.stem] = _Module(ast.parse(path.read_bytes()))
        except (SyntaxError, ValueError, OSError):
            continue
    memo: dict = {}

    def closure(module: str, name: str, seen: set) -> frozenset:
        key = (module, name)
        if key in memo or key in seen or module not in modules:
            return memo.get(key, frozenset())
        seen.add(key)
        mod = modules[module]
        imported = mod.resolve(name)
        if imported is not None:
            found = closure(*imported, seen)
        elif '.' in name and name not in mod.defs:  # an attribute, not a method: all of X
            found = closure(module, name.partition('.')[0], seen)
        else:
            names, compiled = mod.refs(name)
            found = set(compiled)
            for ref in names - {name}:
                found |= closure(*(mod.resolve(ref) or (module, ref)), seen)
            found = frozenset(found)
        memo[key] = found
        return found

    table: dict = {}
    config: dict = {}
    exported = modules.pop('__init__', None)
    for module, mod in modules.items():
        for name, node in mod.defs.items():
            reached = closure(module, name, set())
            if name.startswith('_') or '.' in name or name in mod.ext_vars or not reached:
                continue
            _merge(table, name, _kind(node), reached)
            for registered in _registered_types(node):
                config.setdefault(registered, name)  # the first: not an MLU override
    for name, (module, orig) in (exported.imports.items() if exported else ()):
        node = modules[module].defs.get(orig) if module in modules else None
        reached = closure(module, orig, set())
        if node is not None and reached:
            _merge(table, name, _kind(node), reached)
    return table, config


def _merge(table: dict, name: str, kind: str, compiled: frozenset) -> None:
    old_kind, old = table.get(name, (kind, ()))
    table[name] = (old_kind, tuple(sorted(set(old) | compiled)))


def read_mmcv_ops(root: Path) -> Optional[tuple]:
    """The half-kernel evidence of the mmcv installed at ``root``; None: no csrc there.

    Args:
        root: the ``mmcv`` package folder.

    Returns:
        ``(OPS, CONFIG_TYPES)``: ``{name: (kind, ((device, file, macro), ...))}`` for
        each op whose kernels dispatch a float type (the rows sorted, one per file and
        macro), and ``{registry name: op name}`` for those ops; None when
        ``root/ops/csrc`` does not exist.
    """
    csrc = root / 'ops' / 'csrc'
    if not (csrc / 'pytorch').is_dir():
        return None
    kernels = read_ops_csrc(csrc)
    ops, config = read_ops_python(root / 'ops')
    table = {}
    for name, (kind, compiled) in ops.items():
        rows = {(dev, file, macro) for f in compiled for dev, file, _, macro in kernels.get(f, ())}
        if rows:
            table[name] = (kind, tuple(sorted(rows)))
    return table, {t: name for t, name in config.items() if name in table}
