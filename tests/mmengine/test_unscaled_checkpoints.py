"""Checkpoints of runs that scale nothing (bfloat16, scaling off) load into MMEngine.

MMEngine's ``AmpOptimWrapper`` keeps a GradScaler even in bfloat16, and on a GPU that
GradScaler is enabled: its ``load_state_dict`` refuses an empty state ("The source state
dict is empty, possibly because it was saved from a disabled instance of GradScaler").
This machine has no GPU, so each test builds MMEngine's wrapper (its device check
patched) and then gives it an enabled ``torch.amp.GradScaler('cpu')``: the GradScaler it
would have on a GPU, whose ``load_state_dict`` is the same code. What this package saves
for a run that scales nothing is a full GradScaler state (the scale its configuration
would start from), which that GradScaler loads; it still loads MMEngine's states and
its own older ``{}``.
"""

from __future__ import annotations

import copy
from importlib.util import find_spec

import pytest
import torch

_spec = find_spec('mmengine')
if _spec is None or _spec.origin is None:  # absent, or only this folder (a namespace package)
    pytest.skip('mmengine is not installed: run .ci/mmengine for this tier',
                allow_module_level=True)
import _caps  # noqa: E402
import _runner as R  # noqa: E402  (tests/ is on sys.path: see tests/conftest.py)
import mmengine.optim as mo  # noqa: E402
from mmengine.optim.optimizer import amp_optimizer_wrapper  # noqa: E402

import fp16utils  # noqa: E402
import fp16utils.mmengine as plugin  # noqa: E402

BF16 = torch.bfloat16


@pytest.fixture
def gpu_like_mmengine(monkeypatch):
    """Build MMEngine's bfloat16 AmpOptimWrapper with an enabled GradScaler, as on a GPU."""
    monkeypatch.setattr(amp_optimizer_wrapper, 'is_cuda_available', lambda: True)

    def make(loss_scale='dynamic'):
        model = R.Net(seed=7)
        wrapper = mo.AmpOptimWrapper(copy.deepcopy(loss_scale), dtype='bfloat16',
                                     optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        assert not wrapper.loss_scaler.is_enabled()  # CUDA's: disabled without a GPU
        # The one it would have on a GPU: made from loss_scale as MMEngine makes it, enabled.
        kwargs = (dict(loss_scale) if isinstance(loss_scale, dict) else
                  {'init_scale': loss_scale} if isinstance(loss_scale, float) else {})
        wrapper.loss_scaler = torch.amp.GradScaler('cpu', **kwargs)
        assert wrapper.loss_scaler.is_enabled()
        return wrapper, model

    return make


def _ours(kind, loss_scale, backend='native'):
    _caps.require(BF16, 'native' if backend == 'native' else None, scaled=False)
    model = R.Net(seed=7)
    cls = plugin.Fp16utilsAmpOptimWrapper if kind == 'plugin' else fp16utils.AmpOptimWrapper
    wrapper = cls(copy.deepcopy(loss_scale), dtype='bfloat16', backend=backend, model=model,
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for batch in R.make_data(2):
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        wrapper.update_params(loss)
    assert wrapper.loss_scale == 1.0  # nothing was scaled
    return wrapper, model


@pytest.mark.parametrize('kind, backend', [('ours', 'native'), ('ours', 'legacy'),
                                           ('plugin', 'native')])
@pytest.mark.parametrize('loss_scale, scale', [('dynamic', 2.0**16), (512.0, 512.0),
                                               (dict(init_scale=64.0, growth_interval=9), 64.0)])
def test_mmengines_enabled_grad_scaler_loads_a_bfloat16_checkpoint(gpu_like_mmengine, kind,
                                                                   backend, loss_scale, scale):
    ours, _ = _ours(kind, loss_scale, backend)
    state = ours.state_dict()
    assert set(state['loss_scaler']) == {'scale', 'growth_factor', 'backoff_factor',
                                         'growth_interval', '_growth_tracker'}
    theirs, model = gpu_like_mmengine()
    with pytest.raises(RuntimeError, match='state dict is empty'):  # what {} did
        theirs.loss_scaler.load_state_dict({})
    theirs.load_state_dict(copy.deepcopy(state))
    assert theirs.loss_scaler.get_scale() == scale  # what a scaled run would start from
    if isinstance(loss_scale, dict):
        assert theirs.loss_scaler.get_growth_interval() == 9
    before = [p.detach().clone() for p in model.parameters()]
    theirs.update_params(R.mse(model, R.make_data(1)[0]))  # and trains on
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_a_bfloat16_hook_checkpoint_loads_into_an_enabled_grad_scaler(gpu_like_mmengine,
                                                                      backend):
    _caps.require(BF16, 'native' if backend == 'native' else None, scaled=False)
    hook = fp16utils.Fp16OptimizerHook(loss_scale=512., dtype='bfloat16', backend=backend)
    model = R.Net(seed=7)
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), [hook],
                          max_iters=2, meta={})
    runner.run(R.make_data(2), R.mse)
    theirs, _ = gpu_like_mmengine()
    theirs.loss_scaler.load_state_dict(copy.deepcopy(runner.meta['fp16']['loss_scaler']))
    assert theirs.loss_scaler.get_scale() == 512.0


@pytest.mark.parametrize('kind, backend', [('ours', 'native'), ('ours', 'legacy'),
                                           ('plugin', 'native')])
def test_ours_loads_mmengines_states_and_its_own_old_empty_one(gpu_like_mmengine, kind,
                                                              backend):
    theirs, model = gpu_like_mmengine(dict(init_scale=256.0, growth_interval=1))
    for _ in range(3):
        theirs.update_params(R.mse(model, R.make_data(1)[0]))
    mmengine_state = theirs.state_dict()
    assert mmengine_state['loss_scaler']['scale'] == 256.0 * 2**3
    ours, _ = _ours(kind, 'dynamic', backend)
    for state in (mmengine_state, dict(ours.state_dict(), loss_scaler={})):
        ours.load_state_dict(copy.deepcopy(state))
        assert ours.loss_scale == 1.0  # bfloat16: loaded, and still nothing scaled
    # A float16 wrapper resumed from either takes the scale (or keeps its own for {}).
    _caps.require(torch.float16, 'native' if backend == 'native' else None)
    model16 = R.Net(seed=7)
    f16 = fp16utils.AmpOptimWrapper(dtype='float16', backend=backend, model=model16,
                                    optimizer=torch.optim.SGD(model16.parameters(), lr=0.1))
    f16.load_state_dict(dict(f16.state_dict(), loss_scaler={}))
    assert f16.loss_scale == 2.0**16
    f16.load_state_dict(dict(f16.state_dict(), loss_scaler=mmengine_state['loss_scaler']))
    assert f16.loss_scale == 256.0 * 2**3
    f16.load_state_dict(dict(f16.state_dict(), loss_scaler=ours.state_dict()['loss_scaler']))
    assert f16.loss_scale == 2.0**16  # the bfloat16 run's: its configured start
