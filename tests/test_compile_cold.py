"""The cold compile tier: ``torch.compile(fullgraph=True)`` as the first call of a process.

tests/test_compile.py compiles modules in a process where earlier tests (and
often an eager call) have already answered every question the decorators ask
(is autocast supported for this device and dtype, which backend is the
default), so a question that is answered inside the trace goes unseen. Here
each group of cases runs in a fresh interpreter (tests/_cold_compile.py, one
process per group, nothing warmed): every case is compiled with
``fullgraph=True`` and called before anything runs eagerly, then explained by
``torch._dynamo.explain`` (no graph break, one graph), then run eagerly; the
compiled outputs must equal the eager ones in dtype and value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import _cold_compile as worker  # tests/ is on sys.path: see conftest.py
import pytest
import torch

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent
#: The environment of each group's process (FP16UTILS_BACKEND; None: unset).
_ENV = {'native': None, 'legacy-env': 'legacy'}
_CASES = [(group, name) for group in worker.GROUPS for name in worker.GROUPS[group]]


@pytest.fixture(scope='module')
def cold(tmp_path_factory):
    """``cold(group)``: the results of one group's fresh process (run once per module)."""
    results: Dict[str, Any] = {}

    def get(group: str) -> Dict[str, Any]:
        if group not in results:
            results[group] = _run(group, tmp_path_factory.mktemp(f'cold-{group}'))
        return results[group]
    return get


def _run(group: str, folder: Path) -> Dict[str, Any]:
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [str(_ROOT)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    env.pop('FP16UTILS_BACKEND', None)
    if _ENV[group] is not None:
        env['FP16UTILS_BACKEND'] = _ENV[group]
    out = folder / 'results.pt'
    try:
        proc = subprocess.run(
            [sys.executable, str(_HERE / '_cold_compile.py'), group, str(out)],
            cwd=str(folder), env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f'the cold compile process of group {group!r} ran over {err.timeout} s')
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f'the cold compile process of group {group!r} failed '
                    f'(exit status {proc.returncode}):\n{proc.stderr[-4000:]}')
    return torch.load(str(out), weights_only=False)


def _same(name: str, compiled: list, eager: list) -> None:
    assert len(compiled) == len(eager), name
    for i, (a, b) in enumerate(zip(compiled, eager)):
        assert a.dtype == b.dtype, f'{name}: output {i} is {a.dtype} compiled, {b.dtype} eager'
        assert torch.equal(a, b), f'{name}: output {i} differs by {(a - b).abs().max()}'


@pytest.mark.parametrize('group, name', _CASES, ids=[f'{g}-{n}' for g, n in _CASES])
def test_first_call_compiles_whole_and_matches_eager(cold, group, name):
    results = cold(group)
    if 'skip' in results:
        pytest.skip(results['skip'])
    case = results['cases'][name]
    if 'skip' in case:
        pytest.skip(case['skip'])
    if case['error'] is not None:
        warm = case.get('warm_error', '(not tried)')
        pytest.fail(
            f'{name}: the first compiled call in a fresh process failed: {case["error"]} '
            f'({"compiled after an eager call it works" if warm is None else f"warm too: {warm}"})'
            f'\n{case.get("trace", "")}')
    if name != 'export':
        assert case['breaks'] == 0, case['reasons']
        assert case['graphs'] == 1, case['reasons']
    _same(name, case['compiled'], case['eager'])
    dtypes = case['dtypes']
    assert tuple(t.dtype for t in case['compiled'][:len(dtypes)]) == dtypes


@pytest.mark.parametrize('name', [n for n in worker.GROUPS['native'] if n.startswith('amp-')])
def test_compiled_training_steps_train(cold, name):
    """The compiled forward and the eager update make real steps: none skipped, loss falls."""
    results = cold('native')
    if 'skip' in results:
        pytest.skip(results['skip'])
    case = results['cases'][name]
    if 'skip' in case or case['error'] is not None:
        pytest.skip('see test_first_call_compiles_whole_and_matches_eager')
    assert case['graphs_compiled'] == 1  # no recompilation from one step to the next
    out = case['compiled']  # (prediction, loss, hidden) per step, ..., scale, skipped steps
    losses = [out[3 * i + 1].item() for i in range(worker.STEPS)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert out[-1].item() == 0
    assert out[-2].item() == (2.0 ** 16 if case['dtypes'][0] == torch.float16 else 1.0)


@pytest.mark.parametrize('group', list(worker.GROUPS))
def test_import_decides_what_a_trace_reads(cold, group):
    imported = cold(group)['imported']
    assert imported['default'] == (_ENV[group] or 'native')
    assert imported['autocast'] == [torch.float16, torch.bfloat16]
