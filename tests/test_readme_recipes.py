"""README's recipes, run as a user pastes them."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch

README = Path(__file__).resolve().parents[1].joinpath('README.md').read_text()


def _section(title: str) -> str:
    return README.split(f'\n## {title}\n', 1)[1].split('\n## ', 1)[0]


def _blocks(text: str) -> list:
    return re.findall(r'```python\n(.*?)```', text, re.S)


def test_diagnosing_overflow_recipe_finds_the_layer_and_suggests_a_fix():
    _caps.require(torch.float16, 'native')
    block = _blocks(_section('Diagnosing overflow'))[0]
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, 'README: Diagnosing overflow', 'exec'), namespace)
    report = namespace['report']
    assert not report.ok
    assert report.first_module == '1' and report.suggest() == '1'
    printed = out.getvalue().splitlines()
    assert printed[-2:] == ['1', '1']  # the values the comments in the block promise
    assert 'fp32_modules' in out.getvalue()
    assert namespace['optim_wrapper'].skipped_steps == 0  # the recipe takes no step


def test_plugin_config_example_builds_with_mmengine_rules():
    """The plug-in's paramwise example: a config MMEngine's constructor accepts."""
    block = next(b for b in _blocks(README) if "constructor='Fp16utilsOptimWrapperConstructor'"
                 in b)
    namespace: dict = {}
    exec(block, namespace)
    cfg = _caps.on_this_cpu(dict(namespace['optim_wrapper']))
    cfg.pop('constructor')
    from fp16utils import build_optim_wrapper

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    wrapper = build_optim_wrapper(model, cfg)
    decays = sorted(g['weight_decay'] for g in wrapper.optimizer.param_groups)
    assert decays[0] == 0.0 and decays[-1] == pytest.approx(1e-4)
