"""Shared fixtures: simulate an old torch, force or clear the backend choice.

This folder is put on ``sys.path`` so that the tests share the helper modules
``_runner`` (a minimal mmcv-like runner and tiny models) and ``_dist_worker``
(work for spawned processes) by a plain import.
"""

import sys
from pathlib import Path

import pytest

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp16utils import _torch  # noqa: E402


@pytest.fixture
def low_dtype():
    """The low dtype torch.autocast runs on the CPU here: float16, else bfloat16."""
    import _caps

    return _caps.LOW


@pytest.fixture
def old_torch():
    """Make fp16utils believe torch is 1.5.0 (no native AMP) for one test."""
    _torch.decisions.refresh()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_torch.versions, 'TORCH_VERSION', '1.5.0')
        _torch.decisions.refresh()
        yield '1.5.0'
    _torch.decisions.refresh()


@pytest.fixture
def force_backend():
    """Return ``force(name)``, which sets FP16UTILS_BACKEND for one test."""
    _torch.decisions.refresh()
    with pytest.MonkeyPatch.context() as mp:

        def force(name):
            mp.setenv(_torch.versions.BACKEND_ENV, name)
            _torch.decisions.refresh()
            return name

        yield force
    _torch.decisions.refresh()


@pytest.fixture
def no_backend_env():
    """Unset FP16UTILS_BACKEND for one test, so the choice follows torch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(_torch.versions.BACKEND_ENV, raising=False)
        _torch.decisions.refresh()
        yield
    _torch.decisions.refresh()


@pytest.fixture(scope='module')
def one_thread():
    """One intra-op thread for a module: fastest for tiny tensors, and fair to other work."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def script():
    """``torch.jit.script`` without the deprecation warning that newer torch gives."""
    import warnings

    import torch

    def make(module):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            return torch.jit.script(module)

    return make
