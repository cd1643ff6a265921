"""Scenarios of the rank-agreement tests, run in 2 gloo processes by ``test_ranks.py``.

Run as a script (``python _ranks_worker.py dist RANK WORLD INIT_FILE OUT_DIR GROUP``):
it registers its groups with :mod:`_dist_worker` and runs that worker's ``main``.
Every scenario puts an inf into rank 1's gradient *after* the reduction across
ranks (a DDP comm hook, or the legacy hook's own all-reduce), so that only rank
1 sees it: the ranks must still skip the same step.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

_TESTS = Path(__file__).resolve().parent.parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
import _caps  # noqa: E402
import _dist_worker as W  # noqa: E402

R = W.R
FAULT = W.DIST_FAULT_ITER
STEPS = W.DIST_STEPS
FAULTY_RANK = 1


def _poison_(grad: torch.Tensor) -> None:
    grad.view(-1)[0] = W.INF


def _ddp_with_fault(model: nn.Module, rank: int, where: Dict[str, int],
                    fault: Optional[int] = FAULT) -> nn.Module:
    """DDP whose all-reduce result gets an inf on the faulty rank at iteration ``fault``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp = nn.parallel.DistributedDataParallel(model)

    def poisoning_allreduce(state, bucket):  # no annotations: DDP checks them
        def after(fut):
            value = fut.value()
            tensor = value[0] if isinstance(value, list) else value
            if rank == FAULTY_RANK and where['iter'] == fault:
                _poison_(tensor)
            return tensor

        return default_hooks.allreduce_hook(None, bucket).then(after)

    ddp.register_comm_hook(None, poisoning_allreduce)
    return ddp


def _scalar_allreduces(log: List[Tuple[int, str, int]]) -> List[int]:
    """How many one-element all-reduces each iteration made (the agreement)."""
    counts = [0] * STEPS
    for it, name, numel in log:
        if name == 'all_reduce' and numel == 1 and 0 <= it < STEPS:
            counts[it] += 1
    return counts


def _agree(setting: Any) -> Dict[str, Any]:
    """The ``agree_across_ranks`` argument, left out for the default."""
    return {} if setting is None else {'agree_across_ranks': setting}


def _result(owner: Any, model: nn.Module, optimizer: Any, skipped: List[int],
            scales: List[float], log: List[Tuple[int, str, int]]) -> Dict[str, Any]:
    return {'skipped': skipped, 'scales': scales, 'agreements': _scalar_allreduces(log),
            'history': list(owner.scale_history), 'final': R.snapshot(model, optimizer)}


def run_wrapper(rank: int, backend: str, dtype: torch.dtype, fused: bool = False,
                agree: Any = None, nonfinite: str = 'warn') -> Dict[str, Any]:
    """AmpOptimWrapper under DDP; the fault comes after DDP's all-reduce."""
    from fp16utils import AmpOptimWrapper
    model = R.Net(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, **(
        {'fused': True} if fused else {}))
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(W.WRAPPER_SCALE), backend=backend,
                              model=model, dtype=dtype, nonfinite=nonfinite, **_agree(agree))
    where = {'iter': -1}
    ddp = _ddp_with_fault(model, rank, where)  # after the legacy backend converted it
    skipped, scales, log = [], [], []
    with W.count_collectives(log, lambda: where['iter']):
        for i, (x, y) in enumerate(W.overflow_data(rank)):
            where['iter'] = i
            with wrapper.optim_context(ddp):
                out = ddp(x)
            wrapper.update_params((out.float() - y).pow(2).mean())
            skipped.append(wrapper.skipped_steps)
            scales.append(wrapper.loss_scale)
    return _result(wrapper, model, optimizer, skipped, scales, log)


def run_no_grad_rank(rank: int) -> Dict[str, Any]:
    """No DDP; the optimizer holds a head that only rank 1 uses, and rank 1 overflows.

    Rank 0 has no gradient to check at all, yet takes part and backs off too.
    """
    from fp16utils import AmpOptimWrapper
    body, head = R.Net(seed=0), nn.Linear(4, 4)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(W.WRAPPER_SCALE))
    skipped, scales, log = [], [], []
    where = {'iter': -1}
    with W.count_collectives(log, lambda: where['iter']):
        for i, (x, y) in enumerate(W.overflow_data(rank)):
            where['iter'] = i
            with wrapper.optim_context(body):
                out = body(x).float()
                if rank == FAULTY_RANK:
                    out = head(out).float()
            loss = (out - y).pow(2).mean()
            if rank == FAULTY_RANK and i == FAULT:
                loss = loss * W.INF
            wrapper.update_params(loss)
            skipped.append(wrapper.skipped_steps)
            scales.append(wrapper.loss_scale)
    # The head is trained on rank 1 only: the ranks hold no replicas to compare.
    return {'skipped': skipped, 'scales': scales, 'history': list(wrapper.scale_history),
            'agreements': _scalar_allreduces(log), 'final': {}}


def run_hook(rank: int, backend: str, cumulative: int = 1, ddp: bool = True,
             agree: Any = None) -> Dict[str, Any]:
    """Fp16OptimizerHook (or the cumulative one) on the minimal runner.

    Under DDP the fault comes after DDP's all-reduce; without DDP (legacy
    backend) after the hook's own all-reduce of the master gradients.
    """
    from fp16utils import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kwargs = dict(loss_scale=dict(W.HOOK_SCALE), backend=backend, **_agree(agree))
    hook = (GradientCumulativeFp16OptimizerHook(cumulative_iters=cumulative, **kwargs)
            if cumulative > 1 else Fp16OptimizerHook(**kwargs))
    where = {'iter': -1}
    runner = R.MiniRunner(model, optimizer, [hook], max_iters=STEPS, meta={})
    hook.before_run(runner)  # converts the model first (legacy), so DDP reduces its grads
    # The fault comes at the stepping iteration (a window's last), after the last reduction:
    # the legacy hook all-reduces the master gradients itself, after DDP.
    fault = FAULT + cumulative - 1
    if ddp:
        runner.model = _ddp_with_fault(model, rank, where,
                                       None if backend == 'legacy' else fault)
    if backend == 'legacy':
        engine = hook._engine
        reduce = engine.reduce

        def reduce_then_fault(masters: List[nn.Parameter]) -> None:
            reduce(masters)
            if rank == FAULTY_RANK and where['iter'] == fault:
                _poison_(masters[-1].grad)

        engine.reduce = reduce_then_fault

    def forward(module: nn.Module, batch: Any) -> torch.Tensor:
        where['iter'] = runner.iter
        return R.mse(module, batch)

    data = W.overflow_data(rank)
    skipped, scales, log = [], [], []
    with W.count_collectives(log, lambda: where['iter']):
        for i in range(STEPS):
            runner.run(data, forward, until=i + 1)
            skipped.append(hook.skipped_steps)
            scales.append(hook.loss_scale)
    return _result(hook, model, optimizer, skipped, scales, log)


# --------------------------------------------------------------------------- one-rank raises

def _ddp_faulty_at(model: nn.Module, rank: int, where: Dict[str, int],
                   faults: Tuple[int, ...]) -> nn.Module:
    """DDP whose reduced gradients get an inf on the faulty rank at each iteration of ``faults``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp = nn.parallel.DistributedDataParallel(model)

    def poisoning_allreduce(state, bucket):  # no annotations: DDP checks them
        def after(fut):
            value = fut.value()
            tensor = value[0] if isinstance(value, list) else value
            if rank == FAULTY_RANK and where['iter'] in faults:
                _poison_(tensor)
            return tensor

        return default_hooks.allreduce_hook(None, bucket).then(after)

    ddp.register_comm_hook(None, poisoning_allreduce)
    return ddp


def run_raises(rank: int, kind: str) -> Dict[str, Any]:
    """Errors decided from one rank's gradients: every rank must raise at the same step.

    ``guard``: the overflow guard (``action='raise'``) arms after the agreed skip at
    FAULT; the guarded pass at FAULT + 1 sees a non-finite gradient on rank 1 only.
    ``static-raise``: ``nonfinite='raise'`` with a static scale. ``clip-error``:
    ``clip_grad(error_if_nonfinite=True)``, whose overflow is a skip on both ranks.
    Training goes on after each error; the ranks must end bit-identical.
    """
    from fp16utils import AmpOptimWrapper
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kwargs: Dict[str, Any] = dict(loss_scale=dict(W.WRAPPER_SCALE), dtype=F16)
    faults: Tuple[int, ...] = (FAULT,)
    if kind == 'guard':
        kwargs['overflow_guard'] = dict(max_consecutive=1, action='raise')
        faults = (FAULT, FAULT + 1)
    elif kind == 'static-raise':
        kwargs.update(loss_scale=1024.0, nonfinite='raise')
    else:
        kwargs['clip_grad'] = dict(max_norm=1.0, error_if_nonfinite=True)
    wrapper = AmpOptimWrapper(optimizer, **kwargs)
    where = {'iter': -1}
    ddp = _ddp_faulty_at(model, rank, where, faults)
    raised: List[Any] = []
    skipped: List[int] = []
    for i, (x, y) in enumerate(W.overflow_data(rank)):
        where['iter'] = i
        try:
            with wrapper.optim_context(ddp):
                out = ddp(x)
            wrapper.update_params((out.float() - y).pow(2).mean())
        except FloatingPointError as err:
            report = getattr(err, 'report', None)
            raised.append((i, type(err).__name__, 'another rank' in str(err),
                           report is not None and not report.ok))
        skipped.append(wrapper.skipped_steps)
    return {'raised': raised, 'skipped': skipped, 'taken': wrapper.steps_taken,
            'final': R.snapshot(model, optimizer)}


# --------------------------------------------------------------------------- FSDP2

def _fully_shard() -> Optional[Callable[..., Any]]:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return None
    except ValueError:  # an old torch.distributed.fsdp that this Python cannot import
        return None
    return fully_shard


def _full_params(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().clone() if hasattr(p, 'full_tensor')
            else p.detach().clone() for name, p in model.named_parameters()}


def run_fsdp2(rank: int, policy: bool) -> Dict[str, Any]:
    """fully_shard + AmpOptimWrapper; an inf in rank 1's gradient shard; save and resume."""
    fully_shard = _fully_shard()
    if fully_shard is None:
        return {'skip': 'torch.distributed.fsdp.fully_shard (FSDP2) cannot be imported from '
                        'this torch'}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from fp16utils import AmpOptimWrapper
    dtype = _caps.LOW
    data = W.overflow_data(rank) + W.overflow_data(rank + 10)
    save_at = FAULT + 2

    def build() -> Tuple[nn.Module, Any]:
        model = R.Net(seed=0)
        if policy:
            from torch.distributed.fsdp import MixedPrecisionPolicy
            fully_shard(model, mp_policy=MixedPrecisionPolicy(
                param_dtype=dtype, reduce_dtype=torch.float32))
        else:
            fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return model, AmpOptimWrapper(optimizer, loss_scale=dict(W.WRAPPER_SCALE),
                                      model=model, dtype=dtype)

    def train(model: nn.Module, wrapper: Any, start: int, stop: int,
              skipped: List[int]) -> None:
        for i in range(start, stop):
            x, y = data[i]
            with wrapper.optim_context(model):
                out = model(x)
            wrapper.backward((out.float() - y).pow(2).mean())
            if rank == FAULTY_RANK and i == FAULT:  # this rank's shard of a gradient
                _poison_(model.fc2.weight.grad.to_local())
            wrapper.step()
            wrapper.zero_grad()
            skipped.append(wrapper.skipped_steps)

    model, wrapper = build()
    skipped: List[int] = []
    train(model, wrapper, 0, save_at, skipped)
    buffer = io.BytesIO()
    torch.save({'model': get_model_state_dict(model), 'optim': wrapper.state_dict()}, buffer)
    train(model, wrapper, save_at, len(data), skipped)
    buffer.seek(0)
    ckpt = torch.load(buffer, weights_only=False)
    resumed, rewrapper = build()
    set_model_state_dict(resumed, ckpt['model'])
    rewrapper.load_state_dict(ckpt['optim'])
    resumed_skipped: List[int] = []
    train(resumed, rewrapper, save_at, len(data), resumed_skipped)
    return {'dtype': str(dtype), 'skipped': skipped, 'scale': wrapper.loss_scale,
            'final': _full_params(model), 'resumed_skipped': resumed_skipped,
            'resumed_scale': rewrapper.loss_scale, 'resumed': _full_params(resumed)}


# --------------------------------------------------------------------------- groups

F16 = torch.float16


def _f16(backend: str, scenario: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    return W.float16_or_skip(backend, scenario)


def _f16_gloo(scenario: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """The legacy backend under DDP: gloo must reduce float16 tensors."""
    def run() -> Dict[str, Any]:
        if not W.gloo_takes(F16):
            return {'skip': 'gloo cannot broadcast float16 tensors in this torch'}
        return scenario()
    return _f16('legacy', run)


def _fused(rank: int) -> Dict[str, Any]:
    try:
        torch.optim.Adam([nn.Parameter(torch.ones(1))], fused=True)
    except (RuntimeError, TypeError, ValueError) as err:
        return {'skip': f'torch.optim.Adam(fused=True) is not available on cpu here: {err}'}
    return run_wrapper(rank, 'native', F16, fused=True)


def _bf16(rank: int) -> Dict[str, Any]:
    """bfloat16: no loss scale, the non-finite check (nonfinite='warn') decides."""
    why = _caps.cpu_lacks(torch.bfloat16, 'native', scaled=False)
    return {'skip': why} if why is not None else run_wrapper(rank, 'native', torch.bfloat16)


RANKS_SCENARIOS: Dict[str, Callable[[int], Dict[str, Any]]] = {
    'wrapper-native': lambda r: _f16('native', lambda: run_wrapper(r, 'native', F16)),
    'wrapper-fused': lambda r: _f16('native', lambda: _fused(r)),
    'wrapper-legacy': lambda r: _f16_gloo(lambda: run_wrapper(r, 'legacy', F16)),
    'wrapper-bf16-warn': _bf16,
    'wrapper-no-grad-rank': lambda r: _f16('native', lambda: run_no_grad_rank(r)),
    'wrapper-optout': lambda r: _f16('native', lambda: run_wrapper(r, 'native', F16,
                                                                   agree=False)),
    'hook-native': lambda r: _f16('native', lambda: run_hook(r, 'native')),
    'hook-legacy': lambda r: _f16_gloo(lambda: run_hook(r, 'legacy')),
    'hook-legacy-allreduce': lambda r: _f16('legacy', lambda: run_hook(r, 'legacy', ddp=False)),
    'cumulative-native': lambda r: _f16('native', lambda: run_hook(r, 'native', cumulative=2)),
}
FSDP_SCENARIOS: Dict[str, Callable[[int], Dict[str, Any]]] = {
    'fsdp2-plain': lambda r: run_fsdp2(r, policy=False),
    'fsdp2-policy': lambda r: run_fsdp2(r, policy=True),
}
RAISES_SCENARIOS: Dict[str, Callable[[int], Dict[str, Any]]] = {
    f'raise-{kind}': (lambda k: lambda r: _f16('native', lambda: run_raises(r, k)))(kind)
    for kind in ('guard', 'static-raise', 'clip-error')
}
W.DIST_GROUPS['ranks'] = RANKS_SCENARIOS
W.DIST_GROUPS['raises'] = RAISES_SCENARIOS
W.DIST_GROUPS['fsdp2'] = FSDP_SCENARIOS

if __name__ == '__main__':
    sys.exit(W.main(sys.argv[1:]))
