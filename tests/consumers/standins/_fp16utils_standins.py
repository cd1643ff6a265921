"""Stand-ins for the compiled code that the consumer tier cannot have on a CPU-only torch.

- ``mmcv._ext``: mmcv 1.7.2 is installed without its ops (``MMCV_WITH_OPS=0``), but
  mmdet and mmseg import ``mmcv.ops``, which loads ``mmcv._ext``. The stand-in has
  every name mmcv asks for; calling one records the call and raises. The two build
  facts that ``collect_env`` reads answer ``'n/a'``, as mmcv says without its ops.
- ``torchvision``: the torchvision 0.28.0 wheel on the package index is built for CUDA
  and cannot load its operators next to a CPU-only torch, so ``import torchvision``
  fails there (mmcv's runner imports it, and uses nothing of it for training). Only
  then, ``torchvision`` is an empty stand-in (``torchvision.models`` has no models).

``calls`` lists the stand-in functions that were called; the tier asserts it stays
empty. With ``FP16UTILS_STANDIN_LOG`` set, a process appends its calls to that file
when it exits (for the ``fp16utils run`` subprocesses).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any, List

calls: List[str] = []
torchvision_replaced = False


#: Not ops: what mmcv's ``collect_env`` prints about how the ops were compiled.
_BUILD_INFO = ('get_compiler_version', 'get_compiling_cuda_version')


class _RaisingExt(types.ModuleType):
    """``mmcv._ext``: every attribute is a function that records its call and raises."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith('__'):
            raise AttributeError(name)
        if name in _BUILD_INFO:
            return lambda: 'n/a'

        def compiled_op(*args: Any, **kwargs: Any) -> Any:
            calls.append(f'mmcv._ext.{name}')
            raise RuntimeError(f'mmcv._ext.{name} was called: mmcv is installed without '
                               'its compiled ops in this test environment')

        compiled_op.__name__ = name
        return compiled_op


class _TorchvisionLoader(importlib.abc.Loader):
    """Runs the real torchvision; if its compiled operators cannot load, an empty stand-in."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return None

    def exec_module(self, module: Any) -> None:
        global torchvision_replaced
        try:
            self.loader.exec_module(module)
        except (RuntimeError, OSError):
            for name in [m for m in sys.modules if m.startswith('torchvision.')]:
                del sys.modules[name]
            module.__dict__.update(__version__='0.28.0', __path__=[])
            models = types.ModuleType('torchvision.models')
            module.models = models
            sys.modules['torchvision.models'] = models
            torchvision_replaced = True


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != 'torchvision':
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _TorchvisionLoader(spec.loader)
        return spec


def _write_log() -> None:
    log = os.environ.get('FP16UTILS_STANDIN_LOG')
    if log and calls:
        with open(log, 'a', encoding='utf-8') as f:
            f.write(''.join(f'{os.getpid()} {name}\n' for name in calls))


def install() -> None:
    """Put the stand-ins in place (idempotent); nothing is imported now."""
    if not isinstance(sys.modules.get('mmcv._ext'), _RaisingExt):
        sys.modules['mmcv._ext'] = _RaisingExt('mmcv._ext')
    if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionFinder())
        atexit.register(_write_log)


install()
