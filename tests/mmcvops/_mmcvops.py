"""The mmcv-ops tier's environment: is mmcv 1.7.2 with its compiled ops there, and set-up.

Importing this module where mmcv-full 1.7.2 (mmcv built with ``MMCV_WITH_OPS=1``) is
installed puts an empty ``torchvision`` in place when none can be imported (mmcv's
runner imports it and uses nothing of it: the index's torchvision is a CUDA build that
does not load next to a CPU torch), then patches mmcv with fp16utils before mmdet is
imported, as ``fp16utils run`` does. Elsewhere it only sets ``SKIP_REASON``; each test
module calls :func:`require` first.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from typing import Optional


def _why_not() -> Optional[str]:
    try:
        version = importlib.metadata.version('mmcv-full')
    except importlib.metadata.PackageNotFoundError:
        return ('mmcv-full (mmcv 1.7.2 built with its compiled ops) is not installed; '
                '.ci/mmcvops builds it')
    if not version.startswith('1.7.'):
        return f'mmcv-full {version} is installed; the tier needs 1.7.x'
    try:
        importlib.metadata.version('mmdet')
    except importlib.metadata.PackageNotFoundError:
        return 'mmdet 2.x is not installed; .ci/mmcvops installs it'
    if importlib.util.find_spec('mmcv._ext') is None:
        return 'mmcv-full is installed without mmcv._ext (its compiled ops)'
    return None


SKIP_REASON = _why_not()


def require() -> None:
    """Skip the calling test module, with the reason, where the tier's packages are missing."""
    if SKIP_REASON is not None:
        import pytest

        pytest.skip(SKIP_REASON, allow_module_level=True)


def _empty_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        for name in [m for m in sys.modules if m == 'torchvision' or m.startswith('torchvision.')]:
            del sys.modules[name]
        module = types.ModuleType('torchvision')
        module.__path__ = []  # type: ignore[attr-defined]
        module.__version__ = '0.0'  # type: ignore[attr-defined]
        module.models = types.ModuleType('torchvision.models')  # type: ignore[attr-defined]
        sys.modules['torchvision'] = module
        sys.modules['torchvision.models'] = module.models  # type: ignore[attr-defined]


if SKIP_REASON is None:
    _empty_torchvision()
    import fp16utils

    fp16utils.patch_mmcv()  # before mmdet binds mmcv's names
