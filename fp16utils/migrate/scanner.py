"""Find every 0.x fp16 usage in a source tree: :func:`scan` and its findings.

Files are read with :mod:`ast`, never imported or run; each finding says the 1.x step.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from typing import Optional

from .._args.keys import FP16_HOOK_ARGS, unknown_keys_message
from ._source_files import (
    FP16_MODULE_LEAVES,
    FP16_NAMES,
    MM_PACKAGES,
    TOO_DEEP,
    Source,
    Unreadable,
    alias_text,
    dotted_name,
    is_fp16_module,
    is_mm_module,
    iter_python_files,
    load_source,
    os_reason,
    unreadable,
)
from .half_kernels import report_half_kernels

__all__ = ['Finding', 'scan']

_DECORATORS = frozenset({'auto_fp16', 'force_fp32'})
_FP16_HOOK_TYPES = frozenset({'Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook'})


@dataclass(frozen=True)
class Finding:
    """One 0.x fp16 usage found by :func:`scan`.

    Attributes:
        path: the file, as reached from the scanned path.
        line: 1-based line number.
        col: 1-based column (in characters).
        kind: ``import``, ``module-import``, ``star-import``, ``attribute-use``, ``decorator``,
            ``bare-decorator``, ``forward-decorator``, ``fp16-enabled``, ``config-fp16``,
            ``config-optimizer-hook``, ``config-runner-scaler``, ``half-kernel``, or
            ``syntax-error``/``unreadable`` for a file or folder that was not scanned.
        message: what was found.
        suggestion: the 1.x step to take.

    Example:
        >>> import pathlib, tempfile
        >>> f = pathlib.Path(tempfile.mkdtemp()) / 'm.py'
        >>> _ = f.write_text('from mmcv.runner import auto_fp16' + chr(10))
        >>> print(scan(f)[0])  # doctest: +ELLIPSIS
        /.../m.py:1:1: [import] imports auto_fp16 from mmcv.runner
    """

    path: str
    line: int
    col: int
    kind: str
    message: str
    suggestion: str

    def __str__(self) -> str:
        return f'{self.path}:{self.line}:{self.col}: [{self.kind}] {self.message}'


def _call_name(node: ast.AST) -> Optional[str]:
    """The last name of a decorator or callee expression (``a.b.auto_fp16`` -> auto_fp16)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _dict_keywords(node: ast.AST) -> Optional[dict[str, ast.AST]]:
    """The keys of a ``dict(...)`` call or ``{...}`` literal with constant string keys."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict':
        return {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
    if isinstance(node, ast.Dict):
        return {
            k.value: v
            for k, v in zip(node.keys, node.values)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
    return None


_MIGRATE_HINT = 'fp16utils migrate CONFIG.py (convert_config)'


class _Scanner:
    """One file's findings; ``ast.walk`` (no recursion) reaches an expression of any length."""

    def __init__(self, src: Source, tree: ast.Module) -> None:
        self.src = src
        self.findings: list[Finding] = []
        self.skip: set[int] = set()
        # Names bound to mm modules that hold the fp16 names (``import ... as f``).
        self.module_aliases: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if is_fp16_module(alias.name) and alias.asname:
                        self.module_aliases.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                if is_mm_module(node.module):
                    for alias in node.names:
                        if alias.name in FP16_MODULE_LEAVES:
                            self.module_aliases.add(alias.asname or alias.name)

    def visit(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            handler = getattr(self, f'visit_{type(node).__name__}', None)
            if handler is not None:
                handler(node)

    def add(self, node: ast.AST, kind: str, message: str, suggestion: str) -> None:
        line = node.lineno  # type: ignore[attr-defined]
        col = self.src.char_col(line, node.col_offset) + 1  # type: ignore[attr-defined]
        self.findings.append(Finding(self.src.path, line, col, kind, message, suggestion))

    # -- imports -------------------------------------------------------------------

    def _module_import(self, node: ast.stmt, module: str, bound: str) -> None:
        """Report the 0.x fp16 module ``module`` imported as the name ``bound``."""
        self.add(
            node,
            'module-import',
            f'imports the 0.x fp16 module {module} as {bound}',
            'left alone by --fix: the module object is used as '
            f'{bound}.<name>, so rewriting the import alone would break those '
            'attribute accesses; write `from fp16utils import <names>` by hand '
            'and use the bare names',
        )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if is_fp16_module(alias.name):
                self._module_import(node, alias.name, alias.asname or alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level != 0 or not is_mm_module(node.module):
            return
        module = node.module or ''
        if any(a.name == '*' for a in node.names):
            if is_fp16_module(module):
                self.add(
                    node,
                    'star-import',
                    f'star import from the 0.x fp16 module {module}',
                    'left alone by --fix: a star import does not say which names the file '
                    'uses; list them: `from fp16utils import auto_fp16, force_fp32, ...`',
                )
            return
        names = [a for a in node.names if a.name in FP16_NAMES]
        if names:
            listed = ', '.join(alias_text(a) for a in names)
            others = len(names) != len(node.names)
            self.add(
                node,
                'import',
                f'imports {listed} from {module}',
                f'use `from fp16utils import {listed}` (fp16utils scan --fix does it'
                + (', keeping the other names on the original import' if others else '')
                + '); the behaviour is the same and mmcv is no longer needed for it',
            )
        for alias in node.names:
            if alias.name in FP16_MODULE_LEAVES:
                self._module_import(node, f'{module}.{alias.name}', alias.asname or alias.name)

    # -- decorators ----------------------------------------------------------------

    def _decorators(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            name = _call_name(target)
            if name not in _DECORATORS:
                continue
            self.skip.add(id(target))
            if not isinstance(dec, ast.Call):
                self.add(
                    dec,
                    'bare-decorator',
                    f'@{name} without parentheses on {node.name}(): a bug in 0.x code, the '
                    'method is replaced by the decorator factory and its first call fails',
                    f'write @{name}()'
                    + (
                        ', or delete it: with AmpOptimWrapper the whole forward already '
                        'runs under autocast in optim_context'
                        if name == 'auto_fp16' and node.name == 'forward'
                        else ''
                    ),
                )
            elif name == 'auto_fp16' and node.name == 'forward':
                self.add(
                    dec,
                    'forward-decorator',
                    '@auto_fp16() on forward(): casts the whole forward to fp16',
                    'redundant in the 1.x style: AmpOptimWrapper.optim_context autocasts the '
                    'whole forward; remove it (and the fp16_enabled flag) once the config '
                    f'uses AmpOptimWrapper ({_MIGRATE_HINT}); until then it works with '
                    '`from fp16utils import auto_fp16`',
                )
            elif name == 'auto_fp16':
                self.add(
                    dec,
                    'decorator',
                    f'@auto_fp16() on {node.name}()',
                    'works unchanged with `from fp16utils import auto_fp16`; in the 1.x style '
                    'the forward runs under autocast in optim_context, so it can go once the '
                    'config uses AmpOptimWrapper',
                )
            else:
                self.add(
                    dec,
                    'decorator',
                    f'@force_fp32() on {node.name}()',
                    'works unchanged with `from fp16utils import force_fp32` (the method runs '
                    'in float32 with autocast off); keep it where the method must stay fp32 '
                    'under a whole-forward autocast',
                )

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._decorators(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._decorators(node)

    # -- fp16_enabled and attribute uses -------------------------------------------

    _FLAG_HINT = (
        'only the 0.x decorators read fp16_enabled (wrap_fp16_model sets it); it keeps '
        'working with fp16utils; delete it together with @auto_fp16 once the config uses '
        'AmpOptimWrapper (@force_fp32 keeps its method float32 under autocast without it)'
    )

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == 'fp16_enabled':
            what = {ast.Store: 'sets', ast.Del: 'deletes'}.get(type(node.ctx), 'reads')
            self.add(node, 'fp16-enabled', f'{what} fp16_enabled', self._FLAG_HINT)
        elif node.attr in FP16_NAMES and id(node) not in self.skip:
            base = dotted_name(node.value)
            if base and (base.split('.')[0] in MM_PACKAGES or base in self.module_aliases):
                self.add(
                    node,
                    'attribute-use',
                    f'uses {base}.{node.attr}',
                    f'import it with `from fp16utils import {node.attr}` and use the bare '
                    'name; --fix does not rewrite attribute accesses',
                )

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for stmt in node.body:  # ``fp16_enabled = False`` as a class attribute
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            else:
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id == 'fp16_enabled':
                    self.add(
                        target,
                        'fp16-enabled',
                        'sets fp16_enabled (class attribute)',
                        self._FLAG_HINT,
                    )

    def visit_Call(self, node: ast.Call) -> None:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in ('getattr', 'setattr', 'hasattr', 'delattr')
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == 'fp16_enabled'
        ):
            self.add(node, 'fp16-enabled', f'{node.func.id}(..., "fp16_enabled")', self._FLAG_HINT)

    # -- config files --------------------------------------------------------------

    def config_assignments(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            if not (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                continue
            name = stmt.targets[0].id
            keys = _dict_keywords(stmt.value)
            if keys is None:
                continue
            if name == 'fp16':
                unknown = [k for k in keys if k not in FP16_HOOK_ARGS]
                if unknown:
                    self.add(
                        stmt,
                        'config-fp16',
                        unknown_keys_message('config fp16 = dict(...)', unknown,
                                             FP16_HOOK_ARGS),
                        'fix the key: Fp16OptimizerHook(**fp16), as mmdet 2.x builds it, '
                        'refuses a key it does not take (mmcv\'s hook too)',
                    )
                    continue
                scale = keys.get('loss_scale')
                shown = ast.unparse(scale) if scale is not None else 'default 512.'
                self.add(
                    stmt,
                    'config-fp16',
                    f'config fp16 = dict(...) (loss_scale: {shown})',
                    f'{_MIGRATE_HINT} turns it into '
                    f"optim_wrapper = dict(type='AmpOptimWrapper', loss_scale=...)",
                )
            elif name == 'optimizer_config':
                hook = keys.get('type')
                if isinstance(hook, ast.Constant) and hook.value in _FP16_HOOK_TYPES:
                    self.add(
                        stmt,
                        'config-optimizer-hook',
                        f"config optimizer_config = dict(type='{hook.value}', ...)",
                        f'{_MIGRATE_HINT} folds it into an AmpOptimWrapper optim_wrapper '
                        '(grad_clip -> clip_grad, cumulative_iters -> accumulative_counts)',
                    )
            elif name == 'runner' and 'fp16_loss_scaler' in keys:
                self.add(
                    stmt,
                    'config-runner-scaler',
                    'config runner = dict(fp16_loss_scaler=...)',
                    f"{_MIGRATE_HINT} turns it into optim_wrapper type='AmpOptimWrapper' "
                    'with loss_scale=<the scaler dict>',
                )


def scan(path: str | os.PathLike[str]) -> list[Finding]:
    """Find every 0.x fp16 usage in a Python file or under a folder.

    Reported: imports of the 0.x fp16 names from any mm* package, and of its ``fp16_utils``
    modules; ``@auto_fp16``/``@force_fp32``; ``fp16_enabled``; the config keys ``fp16``,
    ``optimizer_config`` with an fp16 hook, ``runner.fp16_loss_scaler``; uses of mmcv ops
    lacking half kernels. A file or folder that was not read gives one ``syntax-error`` or
    ``unreadable`` finding, so an empty result means everything was read and is clean.

    Args:
        path: a .py file or a folder (hidden folders, ``__pycache__`` and virtual
            environments are skipped).

    Returns:
        The findings, sorted by (path, line, col).

    Raises:
        FileNotFoundError: ``path`` is neither a file nor a folder.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / 'head.py').write_text('from mmcv.runner import force_fp32\\n')
        >>> [(f.line, f.kind) for f in scan(d)]
        [(1, 'import')]
    """
    findings: list[Finding] = []

    def folder_error(err: OSError) -> None:
        why = unreadable(f'cannot list the folder: {os_reason(err)}')
        findings.append(_finding(os.fsdecode(err.filename or path), why))

    for file in iter_python_files(os.fspath(path), onerror=folder_error):
        src, tree, why = load_source(file)
        if why is not None:
            findings.append(_finding(file, why))
            continue
        assert src is not None and tree is not None
        scanner = _Scanner(src, tree)
        try:
            scanner.visit(tree)
            scanner.config_assignments(tree)
            report_half_kernels(tree, scanner.add)
        except RecursionError:
            findings.append(_finding(file, unreadable(TOO_DEEP)))
            continue
        findings.extend(scanner.findings)
    return sorted(findings, key=lambda f: (f.path, f.line, f.col, f.kind))


def _finding(path: str, why: Unreadable) -> Finding:
    return Finding(path, why.line, why.col, why.kind, why.message, why.suggestion)
