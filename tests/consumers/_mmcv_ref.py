"""mmcv 1.x's own fp16 code, as shipped, beside fp16utils' patched names: the reference.

:func:`fp16utils.patch_mmcv` replaces names in mmcv's modules, and mmcv's functions
call one another through those module globals (``auto_fp16`` calls
``cast_tensor_type``, ``patch_norm_fp32`` calls ``patch_forward_method``,
``LossScaler.has_overflow`` calls ``LossScaler._has_inf_or_nan``, the hooks make a
``LossScaler``): after the patch they would call fp16utils. So the reference is a
fresh copy of each installed mmcv source file, executed as a module of its own that
no patch touches. ``torch_version='1.5.0'`` executes it as if mmcv had found that
torch: mmcv's path before autocast (``wrap_fp16_model`` converts the model to half and
keeps the norms in float32; the hook keeps float32 master weights and a
``LossScaler``), the one fp16utils' legacy backend follows.

Nothing here imports mmcv until a function is called (the main suite imports this
file for its doctests where mmcv is absent).

``SHAPES`` counts the call shapes the differential tier compares: each test module
registers its ``(function, argument shape)`` cases with :func:`shapes`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import types
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

#: function -> the argument shapes compared with mmcv (see :func:`shapes`).
SHAPES: Dict[str, Set[str]] = {}

#: The torch version mmcv's code is run against for its pre-autocast path.
OLD_TORCH = '1.5.0'


def shapes(function: str, labels: Sequence[Any]) -> List[Any]:
    """Register ``(function, str(label))`` for each label; return the labels (for parametrize).

    Example:
        >>> shapes('example', ['a', 'b'])
        ['a', 'b']
        >>> sorted(SHAPES.pop('example'))
        ['a', 'b']
    """
    SHAPES.setdefault(function, set()).update(str(label) for label in labels)
    return list(labels)


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _fresh(module_name: str, copy_name: str, torch_version: Optional[str],
           registry: bool = False) -> types.ModuleType:
    """Execute the file of ``module_name`` again as ``copy_name`` (not put in sys.modules)."""
    import mmcv.runner.hooks.hook as hook_module
    import mmcv.utils

    path = sys.modules[module_name].__file__
    spec = importlib.util.spec_from_file_location(copy_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with contextlib.ExitStack() as stack, warnings.catch_warnings():
        warnings.simplefilter('ignore')
        if torch_version is not None:
            stack.enter_context(_replaced(mmcv.utils, 'TORCH_VERSION', torch_version))
        if registry:  # the copy's hooks register themselves: into a registry of their own
            stack.enter_context(_replaced(hook_module, 'HOOKS', mmcv.utils.Registry('hook')))
        spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def fp16_utils(torch_version: Optional[str] = None) -> types.ModuleType:
    """``mmcv/runner/fp16_utils.py`` as shipped (as if on ``torch_version``, when given)."""
    suffix = '' if torch_version is None else '_torch_' + torch_version.replace('.', '_')
    return _fresh('mmcv.runner.fp16_utils', f'mmcv.runner._fp16_utils_as_shipped{suffix}',
                  torch_version)


@functools.lru_cache(maxsize=None)
def optimizer_hooks(torch_version: Optional[str] = None) -> types.ModuleType:
    """``mmcv/runner/hooks/optimizer.py`` as shipped, on the matching :func:`fp16_utils`.

    On the current torch its ``Fp16OptimizerHook`` makes a ``torch.cuda.amp.GradScaler``,
    which is disabled without CUDA; :func:`mmcv_native_hook` gives it the same scaler
    enabled on the CPU, as it runs on a GPU.
    """
    suffix = '' if torch_version is None else '_torch_' + torch_version.replace('.', '_')
    module = _fresh('mmcv.runner.hooks.optimizer',
                    f'mmcv.runner.hooks._optimizer_as_shipped{suffix}', torch_version,
                    registry=True)
    reference = fp16_utils(torch_version)
    module.LossScaler = reference.LossScaler  # type: ignore[attr-defined]
    module.wrap_fp16_model = reference.wrap_fp16_model  # type: ignore[attr-defined]
    return module


def mmcv_native_hook(**kwargs: Any) -> Any:
    """mmcv's GradScaler ``Fp16OptimizerHook`` (torch >= 1.6), its scaler enabled on the CPU."""
    import torch

    module = optimizer_hooks()
    with _replaced(module, 'GradScaler', lambda **args: torch.amp.GradScaler('cpu', **args)):
        return module.Fp16OptimizerHook(**kwargs)


def mmcv_legacy_hook(**kwargs: Any) -> Any:
    """mmcv's own ``Fp16OptimizerHook`` of torch < 1.6: float32 masters and a ``LossScaler``."""
    return optimizer_hooks(OLD_TORCH).Fp16OptimizerHook(**kwargs)


def call(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuple[str, Any]:
    """``('ok', result)`` or ``('raises', exception)``, mmcv's notices silenced.

    mmcv's decorators warn on every call here (``torch.cuda.amp.autocast`` is
    deprecated, and disabled without CUDA).

    Example:
        >>> call(int, '3')
        ('ok', 3)
        >>> call(int, 'x')[0]
        'raises'
    """
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            return 'ok', func(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the exception is the result compared
            return 'raises', err


def compares(function: str, labels: Sequence[Any]) -> Callable[[Any], Any]:
    """A test decorator that registers ``labels`` with :func:`shapes` when it is applied.

    Example:
        >>> @compares('example', ['c'])
        ... def test_it():
        ...     pass
        >>> sorted(SHAPES.pop('example'))
        ['c']
    """
    shapes(function, labels)
    return lambda test: test
