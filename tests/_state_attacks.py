"""Helpers for tests/adversarial: trained wrappers, deep snapshots, bad states."""

from __future__ import annotations

import copy
import io
import math
from typing import Any, Callable, Dict, List, Tuple

import _caps
import _runner as R
import pytest
import torch
from torch import nn

from fp16utils import AmpOptimWrapper

F16 = torch.float16
INF, NAN = math.inf, math.nan
#: A valid mmcv LossScaler state (overflow at 4, now at 10, window 3).
MMCV_STATE = {'cur_scale': 1024.0, 'cur_iter': 10, 'mode': 'dynamic',
              'last_overflow_iter': 4, 'scale_factor': 2.0, 'scale_window': 3}
#: A valid GradScaler state.
TORCH_STATE = {'scale': 512.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
               'growth_interval': 3, '_growth_tracker': 1}


def require_f16(backend: str) -> None:
    """Skip unless the CPU trains float16 with loss scaling on ``backend``."""
    _caps.require(F16, 'native' if backend == 'native' else None)


def trained(backend: str, opt_cls: type = torch.optim.Adam,
            **kwargs: Any) -> Tuple[AmpOptimWrapper, nn.Module]:
    """A wrapper over two param groups, one update and one pending iteration done.

    In float16 where the CPU trains in it here (the scale has then grown once and
    one step was skipped, so every counter is non-trivial), else in bfloat16.
    """
    dtype = _caps.train_dtype(backend)
    model = R.Net(seed=3)
    optimizer = opt_cls([{'params': model.fc1.parameters()},
                         {'params': model.fc2.parameters(), 'lr': 2e-3}], lr=1e-3)
    args = dict(loss_scale=dict(init_scale=256., growth_interval=1), dtype=dtype,
                backend=backend, accumulative_counts=2, model=model)
    args.update(kwargs)
    wrapper = AmpOptimWrapper(optimizer, **args)
    data = R.make_data(5)
    data[2] = R.overflow_batch()
    for batch in data:
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        wrapper.update_params(loss)
    assert wrapper.inner_count % 2 == 1
    assert wrapper.skipped_steps == (1 if dtype == F16 else 0)
    return wrapper, model


def deep(obj: Any) -> Any:
    """A deep copy with every tensor cloned, for :func:`assert_same`."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: deep(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(deep(v) for v in obj)
    return copy.deepcopy(obj)


def assert_same(a: Any, b: Any, where: str = 'state') -> None:
    """Equal structures; tensors bit-identical (dtype, shape, values, nan where nan)."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b) or (
            a.is_floating_point() and torch.equal(torch.isnan(a), torch.isnan(b))
            and torch.equal(a.nan_to_num(), b.nan_to_num())), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, a.keys(), b.keys())
        for key in a:
            assert_same(a[key], b[key], f'{where}.{key}')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f'{where}[{i}]')
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def snap(wrapper: Any, model: nn.Module) -> Dict[str, Any]:
    """Everything a load may change: weights and grads, optimizer, scaler, counters."""
    out: Dict[str, Any] = {
        'model': dict(model.state_dict()),
        'grads': [p.grad for p in model.parameters()],
        'optimizer': wrapper.optimizer.state_dict(),
        'group_params': [[id(p) for p in g['params']] for g in wrapper.optimizer.param_groups],
        'inner_count': wrapper.inner_count,
        'max_counts': wrapper.max_counts,
        'base_param_settings': wrapper.base_param_settings,
    }
    if isinstance(wrapper, AmpOptimWrapper):
        masters = wrapper.master_params
        out.update(loss_scale=wrapper.loss_scale, skipped=wrapper.skipped_steps,
                   history=list(wrapper.scale_history), wrapper_state=wrapper.state_dict(),
                   masters=None if masters is None else [(m, m.grad) for m in masters])
        scaler = wrapper.loss_scaler
        if scaler is not None:
            out['scaler'] = scaler.state_dict()
    return deep(out)


def _roundtrip(obj: Any, weights_only: bool) -> Any:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=weights_only)


def _weights_only_reads_floats() -> bool:
    try:
        return _roundtrip({'x': 1.5}, True) == {'x': 1.5}
    except Exception:  # an unpickler without BINFLOAT
        return False


#: Whether ``torch.load(weights_only=True)`` reads python floats here.
WEIGHTS_ONLY_FLOATS = _weights_only_reads_floats()


def require_weights_only() -> None:
    """Skip unless ``torch.load(weights_only=True)`` reads the states (python floats)."""
    if not WEIGHTS_ONLY_FLOATS:
        pytest.skip('torch.load(weights_only=True) cannot read python floats here')


def weights_only_roundtrip(obj: Any) -> Any:
    """Through ``torch.save`` and ``torch.load(weights_only=True)`` (a full load where
    torch's weights-only reader cannot read python floats)."""
    return _roundtrip(obj, WEIGHTS_ONLY_FLOATS)


def setter(path: List[Any], value: Any) -> Callable[[dict], dict]:
    """A mutation setting ``state[path[0]][path[1]]... = value`` (``value`` may be a callable)."""

    def mutate(state: dict) -> dict:
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value(target[path[-1]]) if callable(value) else value
        return state

    return mutate


def deleter(path: List[Any]) -> Callable[[dict], dict]:
    """A mutation deleting ``state[path[0]]...[path[-1]]``."""

    def mutate(state: dict) -> dict:
        target = state
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return state

    return mutate
