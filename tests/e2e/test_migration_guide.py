"""The migration guide's steps (docs/migration/), followed end to end on a 0.x model with a
``@force_fp32`` loss.

A small 0.x codebase (an ``@auto_fp16`` forward, a ``@force_fp32`` loss, the
``fp16_enabled`` flag, mmcv imports) is written to a temporary folder, then taken
through the guide: scan, fix the imports, convert the config, build the wrapper,
and finally drop the flag and ``@auto_fp16`` (step 6). At every stage the loss must
receive float32, in float16 and in bfloat16: the migration never changes a loss's
dtype silently.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import uuid

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch

from fp16utils import build_optim_wrapper, convert_config, wrap_fp16_model
from fp16utils.migrate import fix_imports, scan

MODEL_0X = textwrap.dedent('''\
    import torch
    from torch import nn
    from mmcv.runner import auto_fp16, force_fp32


    def cpu_autocast_on():
        try:
            return torch.is_autocast_enabled('cpu')
        except TypeError:  # torch < 2.4
            return torch.is_autocast_cpu_enabled()


    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)
            self.fp16_enabled = False
            self.seen = []  # (dtype of pred, autocast on) for every loss call

        @auto_fp16()
        def forward(self, x):
            return self.fc(x)

        @force_fp32(apply_to=('pred',))
        def loss(self, pred, target):
            self.seen.append((pred.dtype, cpu_autocast_on()))
            return ((pred - target) ** 2).mean()
    ''')

CONFIG_0X = dict(
    optimizer=dict(type='SGD', lr=0.05, momentum=0.9),
    optimizer_config=dict(type='Fp16OptimizerHook', grad_clip=dict(max_norm=5.0)),
    fp16=dict(loss_scale=512.),
)


def _load(path):
    name = f'_guide_model_{uuid.uuid4().hex}'
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _step6(source: str) -> str:
    """Step 6 of the guide: the flag and ``@auto_fp16()`` go, ``@force_fp32`` stays."""
    lines = [line for line in source.splitlines(keepends=True)
             if 'fp16_enabled' not in line and '@auto_fp16()' not in line]
    return ''.join(lines)


def _train(head, wrapper, dtype, steps=3):
    torch.manual_seed(0)
    data = [(torch.randn(4, 8), torch.randn(4, 4)) for _ in range(steps)]
    for x, target in data:
        with wrapper.optim_context(head):
            pred = head(x)
            assert pred.dtype == dtype  # the forward runs in low precision
            loss = head.loss(pred, target)
        wrapper.update_params(loss)
    return loss


@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES, ids=lambda d: _caps.NAMES[d])
def test_the_guide_keeps_the_loss_float32(tmp_path, dtype):
    model_file = tmp_path / 'head.py'
    model_file.write_text(MODEL_0X)

    # 1. scan finds the decorators and the mmcv import.
    kinds = {finding.kind for finding in scan(tmp_path)}
    assert {'import', 'decorator', 'forward-decorator', 'fp16-enabled'} <= kinds, kinds

    # 2. fix the imports: the file no longer needs mmcv.
    fix_imports(tmp_path)
    fixed = model_file.read_text()
    assert 'mmcv' not in fixed and 'from fp16utils import' in fixed

    # 0.x style still works after the fix: the loss gets float32.
    head = _load(model_file).Head()
    wrap_fp16_model(head, dtype=dtype)
    head.loss(head(torch.randn(2, 8)), torch.zeros(2, 4))
    assert head.seen[-1] == (torch.float32, False)

    # 3-4. convert the config, switch AMP on in the chosen dtype, build the wrapper.
    cfg = convert_config(CONFIG_0X)
    assert cfg['optim_wrapper']['type'] == 'AmpOptimWrapper'
    cfg['optim_wrapper']['dtype'] = _caps.NAMES[dtype]

    # Flags still there (wrap_fp16_model set them), whole forward under optim_context.
    wrapper = build_optim_wrapper(head, cfg['optim_wrapper'])
    _train(head, wrapper, dtype)
    assert head.seen[-1] == (torch.float32, False)

    # 6. the flag and @auto_fp16 go; @force_fp32 stays: still float32, autocast off.
    model_file.write_text(_step6(fixed))
    source = model_file.read_text()
    assert 'fp16_enabled' not in source and '@auto_fp16' not in source
    assert '@force_fp32' in source
    head = _load(model_file).Head()
    assert not hasattr(head, 'fp16_enabled')
    wrapper = build_optim_wrapper(head, cfg['optim_wrapper'])
    first = [p.detach().clone() for p in head.parameters()]
    loss = _train(head, wrapper, dtype)
    assert head.seen and all(seen == (torch.float32, False) for seen in head.seen)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    # It trained: the weights moved.
    assert any(not torch.equal(a, b) for a, b in zip(first, head.parameters()))
