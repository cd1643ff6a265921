"""fp16utils in place of mmcv 1.x's fp16 names: :func:`patch_mmcv`, :func:`unpatch_mmcv`.

mmcv is imported by :func:`patch_mmcv` only. The hooks and ``wrap_fp16_model`` it
installs are this module's: fp16utils' own, taking the patch's ``dtype`` and
``backend`` as their defaults.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from ._torch import dtypes, versions
from .cast import cast_tensor_type
from .decorators import auto_fp16, force_fp32
from .evaluation.fuse import keeping_weight_dtypes
from .hooks import optimizer as _hooks
from .scaler import LossScaler
from .wrap import patch_forward_method, patch_norm_fp32
from .wrap import wrap_fp16_model as _wrap_fp16_model

__all__ = ['patch_mmcv', 'unpatch_mmcv']

_HOOK_NAMES = ('Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook')
#: mmcv module -> the names replaced there (those the module has).
_TARGETS: Dict[str, Tuple[str, ...]] = {
    'mmcv.runner.fp16_utils': ('auto_fp16', 'force_fp32', 'wrap_fp16_model', 'patch_norm_fp32',
                               'patch_forward_method', 'cast_tensor_type', 'LossScaler'),
    'mmcv.runner': ('auto_fp16', 'force_fp32', 'wrap_fp16_model', 'LossScaler', *_HOOK_NAMES),
    'mmcv.runner.hooks': _HOOK_NAMES,
    'mmcv.runner.hooks.optimizer': ('LossScaler', 'wrap_fp16_model', *_HOOK_NAMES),
    'mmcv.cnn': ('fuse_conv_bn',),
    'mmcv.cnn.utils': ('fuse_conv_bn',),
}
#: Names replaced by a wrapper of mmcv's own function (made once per original).
_WRAPPERS: Dict[str, Callable[[Any], Any]] = {'fuse_conv_bn': keeping_weight_dtypes}
#: Shown for how many modules the already-imported warning names, at most.
_WARN_MODULES = 12


class _Patch:
    """What :func:`patch_mmcv` changed, to put back, and the defaults it was given."""

    def __init__(self) -> None:
        self.dtype: Optional[torch.dtype] = None
        self.backend: Optional[str] = None
        self.runner: Optional[types.ModuleType] = None  # the mmcv.runner that was patched
        self.attrs: List[Tuple[Any, str, Any]] = []     # (owner, name, original)
        self.registry: List[Tuple[Any, str, Any]] = []  # (HOOKS, name, original or None)
        self.replaced: List[str] = []


_patch = _Patch()


# -- what goes into mmcv -------------------------------------------------------------------


class _PatchDefaults:
    """Takes :func:`patch_mmcv`'s ``dtype`` and ``backend`` where the caller gives none."""

    def __init__(self, *args: Any, dtype: Union[torch.dtype, str, None] = None,
                 backend: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, dtype=_patch.dtype if dtype is None else dtype,  # type: ignore[call-arg]
                         backend=_patch.backend if backend is None else backend, **kwargs)


class Fp16OptimizerHook(_PatchDefaults, _hooks.Fp16OptimizerHook):
    """:class:`fp16utils.Fp16OptimizerHook` with :func:`patch_mmcv`'s dtype and backend defaults."""


class GradientCumulativeFp16OptimizerHook(_PatchDefaults,
                                          _hooks.GradientCumulativeFp16OptimizerHook):
    """:class:`fp16utils.GradientCumulativeFp16OptimizerHook` with :func:`patch_mmcv`'s defaults."""


def wrap_fp16_model(model: nn.Module, dtype: Union[torch.dtype, str, None] = None,
                    backend: Optional[str] = None) -> nn.Module:
    """``fp16utils.wrap_fp16_model``, defaulting to :func:`patch_mmcv`'s dtype and backend."""
    return _wrap_fp16_model(model, _patch.dtype if dtype is None else dtype,
                            _patch.backend if backend is None else backend)


_REPLACEMENTS: Dict[str, Any] = {
    'auto_fp16': auto_fp16,
    'force_fp32': force_fp32,
    'wrap_fp16_model': wrap_fp16_model,
    'patch_norm_fp32': patch_norm_fp32,
    'patch_forward_method': patch_forward_method,
    'cast_tensor_type': cast_tensor_type,
    'LossScaler': LossScaler,
    'Fp16OptimizerHook': Fp16OptimizerHook,
    'GradientCumulativeFp16OptimizerHook': GradientCumulativeFp16OptimizerHook,
}


def _resume_keeping_fp16(resume: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``IterBasedRunner.resume``: keep the checkpoint's ``meta['fp16']``; CPU loads."""

    @functools.wraps(resume)
    def wrapper(self: Any, checkpoint: Any, resume_optimizer: bool = True,
                map_location: Any = 'default') -> Any:
        if map_location == 'default' and not torch.cuda.is_available():
            map_location = 'cpu'
        loaded: List[Dict[str, Any]] = []
        load = self.load_checkpoint

        def load_and_keep(*args: Any, **kwargs: Any) -> Any:
            result = load(*args, **kwargs)
            loaded.append(result)
            return result

        own = vars(self).get('load_checkpoint')  # an instance's own, rarely
        self.load_checkpoint = load_and_keep
        try:
            result = resume(self, checkpoint, resume_optimizer, map_location)
        finally:
            if own is None:
                del self.load_checkpoint
            else:
                self.load_checkpoint = own
        meta = loaded[-1].get('meta') if loaded and isinstance(loaded[-1], dict) else None
        if isinstance(meta, dict) and 'fp16' in meta:
            if self.meta is None:
                self.meta = {}
            self.meta['fp16'] = meta['fp16']
        return result

    wrapper.__fp16utils_original__ = resume  # type: ignore[attr-defined]
    return wrapper


# -- patch / unpatch -----------------------------------------------------------------------


def _import_mmcv_runner() -> types.ModuleType:
    try:
        return importlib.import_module('mmcv.runner')
    except ImportError as err:
        try:
            version = importlib.import_module('mmcv').__version__
        except Exception:  # noqa: BLE001 - mmcv itself is what is missing
            version = None
        if version is None:
            raise ImportError(f'patch_mmcv() needs mmcv 1.x, which is not importable ({err}). '
                              "Install it, e.g. MMCV_WITH_OPS=0 pip install 'mmcv>=1.3,<2'."
                              ) from err
        raise ImportError(f'patch_mmcv() needs mmcv 1.x with mmcv.runner; mmcv {version} '
                          f'has none ({err}). mmcv 2.x training runs on MMEngine.') from err


def _set(owner: Any, name: str, value: Any) -> None:
    _patch.attrs.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def patch_mmcv(dtype: Union[torch.dtype, str, None] = None,
               backend: Optional[str] = None) -> List[str]:
    """Put fp16utils' decorators, ``wrap_fp16_model``, ``LossScaler`` and hooks in mmcv 1.x.

    Imports ``mmcv.runner``, replaces mmcv's fp16 names in its modules and its
    ``HOOKS`` registry, and wraps ``IterBasedRunner.resume`` so that the loss scale
    survives it (the list: docs/how-to/mmcv-runner.md). Calling it again changes
    only the defaults. Decorators bind at import: a module imported before the patch
    keeps mmcv's, and the patch warns naming it; patch first (or use ``fp16utils run``).

    Args:
        dtype: The default dtype of the hooks and ``wrap_fp16_model`` as installed
            (None: float16); a config's own ``dtype`` wins.
        backend: Their default backend, ``'native'`` or ``'legacy'`` (None: the
            process default).

    Returns:
        The names replaced, as ``'module.name'`` (registry entries as ``"HOOKS['name']"``).

    Raises:
        ImportError: mmcv is not importable, or has no ``mmcv.runner`` (mmcv 2.x).
        ValueError: An unknown dtype or backend.

    Example:
        >>> import fp16utils
        >>> replaced = fp16utils.patch_mmcv(dtype='bfloat16')  # doctest: +SKIP
        >>> 'mmcv.runner.auto_fp16' in replaced  # doctest: +SKIP
        True
    """
    low = None if dtype is None else dtypes.resolve_dtype(dtype)
    chosen = None if backend is None else versions.resolve_backend(backend)
    runner = _import_mmcv_runner()
    if _patch.runner is not None and _patch.runner is not runner:
        unpatch_mmcv()  # another mmcv was patched (it left sys.modules): forget it
    _patch.dtype, _patch.backend = low, chosen
    if _patch.runner is runner:
        return list(_patch.replaced)
    try:
        originals = _install(runner)
    except BaseException:
        unpatch_mmcv()  # nothing half-patched: put back what was replaced so far
        raise
    _patch.runner = runner
    _warn_already_bound(originals)
    return list(_patch.replaced)


def _install(runner: types.ModuleType) -> Dict[int, str]:
    """Replace the names; return id(original) -> its name, for the warning."""
    originals: Dict[int, str] = {}
    made: Dict[int, Any] = {}
    try:  # tools/test.py binds fuse_conv_bn when it is imported, after the patch
        importlib.import_module('mmcv.cnn')
    except Exception:  # noqa: BLE001 - mmcv.cnn does not import: nothing to wrap there
        pass
    for module_name, names in _TARGETS.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name in names:
            original = getattr(module, name, None)
            if original is None or original is _REPLACEMENTS.get(name) or (
                    name in _WRAPPERS and hasattr(original, '__wrapped__')):
                continue
            if name in _WRAPPERS:
                replacement = made.setdefault(id(original), _WRAPPERS[name](original))
            else:
                replacement = _REPLACEMENTS[name]
                originals[id(original)] = name
            _set(module, name, replacement)
            _patch.replaced.append(f'{module_name}.{name}')
    registry = getattr(runner, 'HOOKS', None)
    if registry is not None:
        for name in _HOOK_NAMES:
            original = registry.get(name)
            registry.register_module(name=name, force=True, module=_REPLACEMENTS[name])
            _patch.registry.append((registry, name, original))
            _patch.replaced.append(f"HOOKS['{name}']")
    iter_runner = getattr(runner, 'IterBasedRunner', None)
    resume = None if iter_runner is None else iter_runner.__dict__.get('resume')
    if resume is not None:
        _set(iter_runner, 'resume', _resume_keeping_fp16(resume))
        _patch.replaced.append(f'{iter_runner.__module__}.IterBasedRunner.resume')
    return originals


def unpatch_mmcv() -> List[str]:
    """Put back what :func:`patch_mmcv` replaced in mmcv (nothing patched: nothing to do).

    Classes decorated while the patch was in place keep fp16utils' decorators.

    Returns:
        The names put back (empty when nothing was patched).

    Example:
        >>> import fp16utils
        >>> fp16utils.unpatch_mmcv()
        []
    """
    for owner, name, original in reversed(_patch.attrs):
        setattr(owner, name, original)
    for registry, name, original in reversed(_patch.registry):
        if original is None:
            registry._module_dict.pop(name, None)
        else:
            registry.register_module(name=name, force=True, module=original)
    restored = list(_patch.replaced)
    _patch.__init__()  # type: ignore[misc]
    return restored


# -- the warning about what was bound before the patch -----------------------------------


def _decorator_codes() -> Dict[int, Any]:
    """id -> code object of the functions that mmcv's decorators return (by identity)."""
    codes: Dict[int, Any] = {}
    for _, name, original in _patch.attrs:
        if name in ('auto_fp16', 'force_fp32') and callable(original):
            try:
                code = original()(lambda self: None).__code__
            except Exception:  # noqa: BLE001 - a decorator of another shape: nothing to find
                continue
            codes[id(code)] = code
    return codes


def _functions_of(cls: type) -> List[Tuple[str, Any]]:
    """``cls``'s own functions (those of static/class methods and properties too)."""
    found = []
    for attr, value in vars(cls).items():
        kind = type(value)  # type(), never isinstance(): lazy objects import on access
        if kind is staticmethod or kind is classmethod:
            value = value.__func__
        elif kind is property:
            value = value.fget
        if type(value) is types.FunctionType:
            found.append((attr, value))
    return found


def _still_bound(originals: Dict[int, str], codes: Dict[int, Any]
                 ) -> Dict[str, List[str]]:
    """module name -> what it still holds of mmcv's (names, or Class.method decorated)."""
    patched = {id(owner) for owner, _, _ in _patch.attrs}
    held: Dict[str, List[str]] = {}
    for module_name, module in list(sys.modules.items()):
        if (type(module) is not types.ModuleType or id(module) in patched
                or module_name.partition('.')[0] == 'fp16utils'):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in originals:
                held.setdefault(module_name, []).append(attr)
            elif (codes and issubclass(type(value), type)
                    and vars(value).get('__module__') == module_name):
                for method, func in _functions_of(value):
                    if id(func.__code__) in codes:
                        held.setdefault(module_name, []).append(f'{value.__qualname__}.{method}')
    return held


def _warn_already_bound(originals: Dict[int, str]) -> None:
    held = _still_bound(originals, _decorator_codes())
    if not held:
        return
    names = sorted(held)
    shown = [f'{name} ({", ".join(held[name][:3])}{", ..." if len(held[name]) > 3 else ""})'
             for name in names[:_WARN_MODULES]]
    more = f', and {len(names) - _WARN_MODULES} more' if len(names) > _WARN_MODULES else ''
    warnings.warn(
        f"patch_mmcv(): {len(names)} module(s) imported before the patch still hold mmcv's "
        f'fp16 decorators or names, which bind at import: {"; ".join(shown)}{more}. Call '
        'patch_mmcv() before importing them, or start the program with `fp16utils run`.',
        UserWarning, stacklevel=3)
