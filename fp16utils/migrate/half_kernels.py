"""Which mmcv ops have no float16 or bfloat16 kernel, read from mmcv's own sources.

Standard library only: mmcv and torch are never imported. Where an mmcv with its C++
sources is installed (``mmcv/ops/csrc``, found with :func:`importlib.util.find_spec`),
its kernels are read: per op, per device (cpu, cuda), the file and the dispatch macro
that decide which dtypes the kernel is compiled for. Elsewhere the table read the same
way from mmcv 1.7.2 and shipped here (:mod:`._mmcv172_kernels`) stands in.
:func:`report_half_kernels` is the rule of ``fp16utils scan`` that reports where user
code and configs use such an op.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from . import _mmcv172_kernels as _shipped
from ._csrc import FIXED_FLOAT, dispatch_dtypes
from ._mmcv_ops import read_mmcv_ops
from ._source_files import dotted_name

__all__ = ['Kernel', 'KernelTable', 'OpKernels', 'find_mmcv', 'kernel_table',
           'read_kernel_table', 'report_half_kernels', 'shipped_table']

LOW_DTYPES = ('float16', 'bfloat16')
_PAGES = {'macro': 'docs/troubleshooting/not-implemented-for-half.md',
          'fixed': 'docs/troubleshooting/expected-scalar-type.md'}


@dataclass(frozen=True, order=True)
class Kernel:
    """The kernels of one op on one device, as one source file dispatches them.

    Attributes:
        device: ``cpu`` or ``cuda``.
        file: the file under ``mmcv/ops/csrc`` (``pytorch/cpu/roi_align.cpp``).
        dispatch: the dispatch macro (``AT_DISPATCH_FLOATING_TYPES_AND_HALF``) or
            ``float only (no AT_DISPATCH)``.
    """

    device: str
    file: str
    dispatch: str

    @property
    def dtypes(self) -> frozenset:
        """The low-precision dtypes it has kernels for (``float16``, ``bfloat16``)."""
        return dispatch_dtypes(self.dispatch)

    def __str__(self) -> str:
        return f'{self.device}: {self.file} {self.dispatch}'


@dataclass(frozen=True)
class OpKernels:
    """An mmcv op and the kernels behind it.

    Attributes:
        name: its name in ``mmcv.ops`` (``RoIAlign``, ``roi_align``).
        kind: ``module`` (an ``nn.Module`` class) or ``function`` (a function or an
            autograd Function).
        kernels: one per device, file and macro, sorted.
    """

    name: str
    kind: str
    kernels: tuple

    def lacking(self, dtype: str) -> tuple:
        """The kernels without an instance for ``dtype`` (``float16`` or ``bfloat16``)."""
        return tuple(k for k in self.kernels if dtype not in k.dtypes)

    def devices_lacking(self, dtype: str) -> list:
        """The devices with a kernel that lacks ``dtype``, in order."""
        return list(dict.fromkeys(k.device for k in self.lacking(dtype)))


@dataclass(frozen=True)
class KernelTable:
    """The ops of one mmcv version that lack a half kernel somewhere.

    Attributes:
        version: the mmcv version read.
        source: where the evidence comes from, in words.
        ops: ``{name: OpKernels}`` of every op with a kernel that dispatches a float
            type (those without a float16 or bfloat16 kernel are the ones to report).
        config_types: ``{registry name: op name}`` (``'DCN'`` -> ``DeformConv2dPack``).
        from_sources: True when read from an installed mmcv's csrc.

    Example:
        >>> table = shipped_table()
        >>> table.op('RoIAlign').devices_lacking('bfloat16')
        ['cpu', 'cuda']
    """

    version: str
    source: str
    ops: Mapping = field(repr=False)
    config_types: Mapping = field(repr=False)
    from_sources: bool = False

    def op(self, name: str) -> Optional[OpKernels]:
        """The op called ``name`` (or built by the config type ``name``), else None."""
        found = self.ops.get(name)
        if found is None and name in self.config_types:
            found = self.ops.get(self.config_types[name])
        return found

    def config_op(self, type_name: str) -> Optional[OpKernels]:
        """The op a config's ``type`` builds: a registry name first (``'carafe'`` is
        ``CARAFEPack`` there, not the function ``carafe``), else an op's own name."""
        if type_name in self.config_types:
            return self.ops.get(self.config_types[type_name])
        return self.ops.get(type_name)

    def as_dicts(self) -> tuple:
        """``({name: (kind, ((device, file, dispatch), ...))}, config_types)``: what the
        table says, independent of how it was stored."""
        ops = {n: (o.kind, tuple((k.device, k.file, k.dispatch) for k in o.kernels))
               for n, o in self.ops.items()}
        return ops, dict(self.config_types)


def _build(version: str, source: str, ops: Mapping, config: Mapping,
           from_sources: bool) -> KernelTable:
    built = {name: OpKernels(name, kind, tuple(sorted(Kernel(*row) for row in rows)))
             for name, (kind, rows) in ops.items()}
    return KernelTable(version, source, built, dict(config), from_sources)


def find_mmcv() -> Optional[Path]:
    """The folder of the installed ``mmcv`` package, found without importing it.

    Returns:
        The package folder, or None when no mmcv can be found.
    """
    try:
        spec = importlib.util.find_spec('mmcv')
    except (ImportError, ValueError):  # a broken or half-imported mmcv
        return None
    if spec is None or not spec.origin or not spec.origin.endswith('__init__.py'):
        return None
    return Path(spec.origin).parent


def _version(root: Path) -> str:
    try:
        text = (root / 'version.py').read_text(encoding='utf-8')
    except OSError:
        return 'unknown'
    match = re.search(r'''__version__\s*=\s*['"]([^'"]+)['"]''', text)
    return match.group(1) if match else 'unknown'


def read_kernel_table(root: Path) -> Optional[KernelTable]:
    """The table of the mmcv whose package folder is ``root``, read from its csrc.

    Args:
        root: an ``mmcv`` package folder (with ``ops/csrc`` and ``ops/*.py``).

    Returns:
        The table, or None when ``root`` holds no ``ops/csrc``.

    Example:
        >>> import tempfile
        >>> read_kernel_table(Path(tempfile.mkdtemp())) is None
        True
    """
    read = read_mmcv_ops(root)
    if read is None:
        return None
    version = _version(root)
    return _build(version, f"read from mmcv {version}'s csrc at {root / 'ops' / 'csrc'}", *read,
                  from_sources=True)


def shipped_table() -> KernelTable:
    """The table read from mmcv 1.7.2's csrc and shipped with fp16utils."""
    ops = {}
    for name, entry in _shipped.OPS.items():
        kind, key = entry.split()
        ops[name] = (kind, tuple(tuple(row.split(' ', 2)) for row in _shipped.EVIDENCE[key]))
    return _build(_shipped.VERSION, f"mmcv {_shipped.VERSION}'s csrc, from the table fp16utils "
                  'ships, as no mmcv with its C++ sources is installed', ops,
                  _shipped.CONFIG_TYPES, from_sources=False)


@functools.lru_cache(maxsize=None)
def kernel_table() -> KernelTable:
    """The installed mmcv's table where its sources are there, else :func:`shipped_table`.

    Read once per process. A csrc that cannot be read counts as absent.
    """
    root = find_mmcv()
    table = None
    if root is not None:
        try:
            table = read_kernel_table(root)
        except (OSError, ValueError, RecursionError):  # unreadable, undecodable, too deep
            table = None
    return table if table is not None else shipped_table()


# -- the scan rule -------------------------------------------------------------------

Add = Callable[[ast.AST, str, str, str], None]


def _type_value(node: ast.AST) -> Optional[ast.Constant]:
    """The constant ``type`` of a ``dict(type=...)`` call or ``{'type': ...}`` literal."""
    value = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict':
        value = next((k.value for k in node.keywords if k.arg == 'type'), None)
    elif isinstance(node, ast.Dict):
        value = next((v for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == 'type'), None)
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value
    return None


def _bindings(tree: ast.AST) -> tuple:
    """(names bound to mmcv ops, names bound to mmcv modules) by the file's imports."""
    names: dict[str, tuple] = {}  # local name -> (op name, import node)
    modules: dict[str, str] = {}  # local name -> dotted module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == 'mmcv' or alias.name.startswith('mmcv.'):
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:
                        modules['mmcv'] = 'mmcv'
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            for alias in node.names:
                local = alias.asname or alias.name
                if module == 'mmcv' and alias.name == 'ops':
                    modules[local] = 'mmcv.ops'
                elif module == 'mmcv.ops' or module.startswith('mmcv.ops.'):
                    names[local] = (alias.name, node)
                    modules[local] = f'{module}.{alias.name}'  # a submodule, maybe
    return names, modules


def _message(op: OpKernels, table: KernelTable) -> tuple:
    """(what the kernels lack, the evidence, the pages to read) for one op."""
    by_devices: dict = {}  # devices lacking -> dtypes
    evidence: list = []
    pages = []
    for dtype in LOW_DTYPES:
        devices = tuple(op.devices_lacking(dtype))
        if devices:
            by_devices.setdefault(devices, []).append(dtype)
        for kernel in op.lacking(dtype):
            if kernel not in evidence:
                evidence.append(kernel)
            page = _PAGES['fixed' if kernel.dispatch == FIXED_FLOAT else 'macro']
            if page not in pages:
                pages.append(page)
    lacks = '; '.join(f'no {" or ".join(dtypes)} kernel on {" or ".join(devices)}'
                      for devices, dtypes in by_devices.items())
    shown = '; '.join(str(k) for k in evidence)
    return lacks, f'{shown} ({table.source})', pages


def _suggestion(op: OpKernels, local: str, pages: list) -> str:
    if op.kind == 'module':
        fix = (f"keep it in float32: fp32_modules=['{op.name}'] (AmpOptimWrapper, "
               'wrap_fp16_model, the optim_wrapper config) or keep_fp32 on the module')
    else:
        short = local.rsplit('.', 1)[-1]
        fix = (f'run it in float32: {short} = fp16utils.fp32_function({local}, '
               'cast_output=True), and call that; or keep the module that calls it in '
               'float32 (fp32_modules)')
    return f'{fix}; `fp16utils doctor` confirms what fails; see {" and ".join(pages)}'


def report_half_kernels(tree: ast.Module, add: Add,
                        table: Optional[KernelTable] = None) -> None:
    """Report each use of an mmcv op that lacks a float16 or bfloat16 kernel.

    Reported, as ``half-kernel`` findings: each use of a name imported from
    ``mmcv.ops`` (or one of its modules), or the import itself when the name is not
    used in the file; each ``mmcv.ops.<op>`` reached through an imported module; each
    ``dict(type=...)`` / ``{'type': ...}`` naming such an op or its registry name
    (``type='DCN'``). Names merely alike (torchvision's ``roi_align``, a class of the
    user's own called ``RoIAlign``) are not reported: only what the imports bind to
    mmcv counts, and config types only by their exact name.

    Args:
        tree: the parsed file.
        add: called as ``add(node, kind, message, suggestion)`` per finding.
        table: the kernel table (default: :func:`kernel_table`).

    Example:
        >>> found = []
        >>> tree = ast.parse('from mmcv.ops import RoIAlign' + chr(10) + 'm = RoIAlign(7)')
        >>> report_half_kernels(tree, lambda node, *rest: found.append((node.lineno, rest[1])))
        >>> found[0][0], found[0][1].split(':')[0]
        (2, 'uses mmcv.ops.RoIAlign')
    """
    table = table if table is not None else kernel_table()
    names, modules = _bindings(tree)
    used: set[str] = set()
    inner: set[int] = set()

    def report(node: ast.AST, op: OpKernels, what: str, local: str) -> None:
        lacks, evidence, pages = _message(op, table)
        if lacks:
            add(node, 'half-kernel', f'{what}: {lacks}; evidence: {evidence}',
                _suggestion(op, local, pages))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
            dotted = dotted_name(node)
            if id(node) in inner or dotted is None:
                continue
            head, _, rest = dotted.partition('.')
            full = f'{modules[head]}.{rest}' if head in modules else ''
            if not full.startswith('mmcv.ops.'):
                continue
            parts = full[len('mmcv.ops.'):].split('.')
            op = next((table.ops[p] for p in reversed(parts) if p in table.ops), None)
            if op is not None:
                used.add(head)
                report(node, op, f'uses mmcv.ops.{op.name}', dotted)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and (
                node.id in names and id(node) not in inner):
            op = table.ops.get(names[node.id][0])
            used.add(node.id)
            if op is not None:
                report(node, op, f'uses mmcv.ops.{op.name}', node.id)
        else:
            value = _type_value(node)
            op = table.config_op(value.value) if value is not None else None
            if op is not None:
                built = '' if op.name == value.value else f' (mmcv.ops.{op.name})'
                report(value, op, f"config type='{value.value}'{built}", op.name)
    for local, (name, node) in names.items():
        op = table.ops.get(name)
        if local not in used and op is not None:
            report(node, op, f'imports {name} from {node.module}', local)
