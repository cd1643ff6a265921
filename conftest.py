"""Collection rules for the whole checkout (doctests included).

- fp16utils.mmengine imports mmengine at import time; its doctests run in the MMEngine
  tier (.ci/mmengine) and are skipped where mmengine is not installed (a spec without
  an origin is a namespace package, such as the folder tests/mmengine).
- Examples that train in float16 (an AmpOptimWrapper, or an Fp16OptimizerHook that
  starts a run, at their default dtype) are skipped, naming the missing capability,
  where this torch cannot train float16 on the CPU (no float16 kernels or no CPU
  GradScaler).
"""

from __future__ import annotations

import re
from importlib.util import find_spec

import pytest

_spec = find_spec('mmengine')
collect_ignore = ([] if _spec is not None and _spec.origin is not None
                  else ['fp16utils/mmengine.py'])

# A wrapper, an engine and wrap_fp16_model check their dtype when called; a hook when
# the run starts (before_run).
_TRAINS = re.compile(
    r'\b(AmpOptimWrapper\(|build_optim_wrapper\(|make_grad_scaler\(|NativeEngine\(|'
    r'make_observed_grad_scaler\(|convert_or_defer\(|'
    r'wrap_fp16_model\(|\.before_run\()')


def _cpu_float16_lacks() -> str | None:
    import torch

    from fp16utils import _torch

    if not _torch.caps.kernels_support('cpu', torch.float16):
        return 'torch has no float16 matrix kernels on cpu here'
    return _torch.caps.native_reason('cpu', torch.float16)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    from _pytest.doctest import DoctestItem

    doctests = [item for item in items if isinstance(item, DoctestItem)]
    if not doctests:
        return
    why = _cpu_float16_lacks()
    if why is None:
        return
    for item in doctests:
        source = ''.join(example.source for example in item.dtest.examples)
        if _TRAINS.search(source) and 'bfloat16' not in source:
            item.add_marker(pytest.mark.skip(reason=f'the example trains in float16: {why}'))
