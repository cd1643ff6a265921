"""Work done in separate processes for the distributed and resume tests.

Run as a script by the tests, never collected by pytest itself:

``python _dist_worker.py dist RANK WORLD_SIZE INIT_FILE OUT_DIR [GROUP]``
    joins a gloo process group (``file://`` init) and runs every distributed
    scenario of the group (:data:`DIST_GROUPS`, default ``'main'``), writing
    ``OUT_DIR/rank{RANK}.pt``.
``python _dist_worker.py resume MANIFEST``
    continues every checkpoint listed in the JSON manifest in this fresh
    process and writes each job's final state where the manifest says.

The test files import this module by path too, so the code that builds a
scenario is the same in the parent and in the child processes.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

#: Exit status of a worker that could not join the process group (the tests skip then).
EXIT_NO_GLOO = 77
#: Exit status of a worker whose scenario raised (the tests fail with its traceback).
EXIT_FAILED = 3

_HERE = Path(__file__).resolve().parent


if str(_HERE) not in sys.path:  # run as a script, or imported by the tests
    sys.path.insert(0, str(_HERE))
import _caps  # noqa: E402
import _runner as R  # noqa: E402

INF = float('inf')


def clone_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    """Every parameter, buffer, optimizer parameter (masters) and optimizer state tensor."""
    return R.snapshot(model, optimizer)


@contextlib.contextmanager
def backend_env(name: Optional[str]) -> Any:
    """Set (or clear) ``FP16UTILS_BACKEND`` for a block, refreshing the cached choice."""
    from fp16utils import _torch
    old = os.environ.pop(_torch.versions.BACKEND_ENV, None)
    if name is not None:
        os.environ[_torch.versions.BACKEND_ENV] = name
    _torch.decisions.refresh()
    try:
        yield
    finally:
        os.environ.pop(_torch.versions.BACKEND_ENV, None)
        if old is not None:
            os.environ[_torch.versions.BACKEND_ENV] = old
        _torch.decisions.refresh()


@contextlib.contextmanager
def simulated_torch(version: str) -> Any:
    """Make fp16utils believe torch is ``version`` (with no backend forced by the env)."""
    from fp16utils import _torch
    saved = _torch.versions.TORCH_VERSION
    with backend_env(None):
        _torch.versions.TORCH_VERSION = version
        _torch.decisions.refresh()
        try:
            yield
        finally:
            _torch.versions.TORCH_VERSION = saved
            _torch.decisions.refresh()


# --------------------------------------------------------------------------- distributed

#: The 0-based iteration at which a fault is injected in the distributed scenarios.
DIST_FAULT_ITER = 2
DIST_STEPS = 5
#: Loss scale settings in each style's vocabulary (x2 growth is far away, /2 backoff).
WRAPPER_SCALE = dict(init_scale=1024.0, growth_interval=1000)
HOOK_SCALE = dict(init_scale=1024.0, mode='dynamic', scale_factor=2.0, scale_window=1000)
#: (coalesce, bucket_size_mb) of the legacy hook's own all-reduce scenarios.
ALLREDUCE_SETTINGS = ((True, -1), (True, 0.0006), (False, -1))
NO_SYNC_STEPS = 4
#: Seconds a rank waits for another one (to join the group, in a collective, at the final
#: barrier): an upper bound, never an expected time. On a loaded machine a rank can be off
#: the CPU for tens of seconds while its peer waits (30 s failed there: "Timed out waiting
#: 30000ms for send operation to complete"). The parent kills the workers at its own
#: deadline, test_distributed.TIMEOUT_S, which is longer.
PG_TIMEOUT_S = 300


def overflow_data(rank: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's own batches (different data on every rank)."""
    return R.make_data(DIST_STEPS, seed=100 + rank)


def allreduce_data(rank: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's batches for the legacy all-reduce scenarios; rank 1 overflows once."""
    data = R.make_data(DIST_STEPS, seed=200 + rank)
    if rank == 1:
        x, y = data[DIST_FAULT_ITER]
        x = x.clone()
        x[0, 0] = INF
        data[DIST_FAULT_ITER] = (x, y)
    return data


def no_sync_data(rank: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return R.make_data(NO_SYNC_STEPS, batch_size=2, seed=300 + rank)


def _poison(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    grad.view(-1)[0] = INF
    return grad


def _ddp(model: nn.Module) -> nn.Module:
    return nn.parallel.DistributedDataParallel(model)


def run_overflow(style: str, backend: str, inject: str, rank: int) -> Dict[str, Any]:
    """Train under DDP; one rank gets an inf in its input or in a gradient at one iteration.

    The fault is injected before DDP's all-reduce (in the input, or by a tensor
    hook on a parameter, which runs before the gradient is accumulated and
    reduced), so only one rank ever sees a non-finite value locally.
    """
    faulty_rank = 1 if inject == 'input' else 0
    local_fault = rank == faulty_rank
    data = overflow_data(rank)
    model = R.Net(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    where = {'iter': -1}

    def arm_grad_fault() -> None:
        if inject == 'grad' and local_fault:
            model.fc2.weight.register_hook(
                lambda g: _poison(g) if where['iter'] == DIST_FAULT_ITER else g)

    def batch_for(i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = data[i]
        if inject == 'input' and local_fault and i == DIST_FAULT_ITER:
            x = x.clone()
            x[1, 3] = INF
        return x, y

    skipped: List[int] = []
    scales: List[float] = []
    snaps: Dict[str, Dict[str, torch.Tensor]] = {}
    if style == 'wrapper':
        from fp16utils import AmpOptimWrapper
        wrapper = AmpOptimWrapper(optimizer, loss_scale=WRAPPER_SCALE, backend=backend,
                                  model=model)
        ddp = _ddp(model)  # after the legacy backend converted the model to half
        arm_grad_fault()
        owner: Any = wrapper
        for i in range(DIST_STEPS):
            where['iter'] = i
            x, y = batch_for(i)
            with wrapper.optim_context(ddp):
                out = ddp(x)
            if i == DIST_FAULT_ITER:
                snaps['before_fault'] = clone_state(model, optimizer)
            wrapper.update_params((out.float() - y).pow(2).mean())
            if i == DIST_FAULT_ITER:
                snaps['after_fault'] = clone_state(model, optimizer)
            skipped.append(wrapper.skipped_steps)
            scales.append(wrapper.loss_scale)
        chosen = wrapper.backend
    else:
        from fp16utils import Fp16OptimizerHook
        # How the 0.x hook picks its backend: the process default, which
        # FP16UTILS_BACKEND overrides (no backend= argument, as in mmcv configs).
        env = 'legacy' if backend == 'legacy' else None
        with backend_env(env):
            hook = Fp16OptimizerHook(loss_scale=dict(HOOK_SCALE))
            ddp = _ddp(model)  # mmcv order: DDP first, the hook converts runner.model
            runner = R.MiniRunner(ddp, optimizer, [hook], max_iters=DIST_STEPS, meta={})

            def forward(module: nn.Module, batch: Any) -> torch.Tensor:
                where['iter'] = runner.iter
                return R.mse(module, batch_for(runner.iter))

            hook.before_run(runner)
            arm_grad_fault()
            for i in range(DIST_STEPS):
                if i == DIST_FAULT_ITER:
                    snaps['before_fault'] = clone_state(model, optimizer)
                runner.run(data, forward, until=i + 1)
                if i == DIST_FAULT_ITER:
                    snaps['after_fault'] = clone_state(model, optimizer)
                skipped.append(hook.skipped_steps)
                scales.append(hook.loss_scale)
        owner = hook
        chosen = hook.backend
    return {
        'backend': chosen,
        'local_fault': local_fault,
        'skipped': skipped,
        'scales': scales,
        'scale_history': list(owner.scale_history),
        'final': clone_state(model, optimizer),
        **snaps,
    }


_COLLECTIVES = ('all_reduce', 'all_gather', 'all_gather_into_tensor', 'broadcast',
                'reduce', 'reduce_scatter', 'reduce_scatter_tensor', 'barrier',
                'all_reduce_coalesced', 'all_gather_object', 'broadcast_object_list')


@contextlib.contextmanager
def count_collectives(log: List[Tuple[int, str, int]], where: Callable[[], int]) -> Any:
    """Record ``(iteration, name, numel)`` for every torch.distributed collective called."""
    import torch.distributed as dist
    saved = {}
    for name in _COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue
        saved[name] = original

        def counting(*args: Any, _name: str = name, _orig: Any = original, **kwargs: Any) -> Any:
            tensor = args[0] if args else kwargs.get('tensor')
            numel = tensor.numel() if isinstance(tensor, torch.Tensor) else -1
            log.append((where(), _name, numel))
            return _orig(*args, **kwargs)

        setattr(dist, name, counting)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def allreduce_hook(coalesce: bool, bucket_size_mb: float, distributed: bool = True,
                   dtype: Optional[torch.dtype] = None) -> Any:
    from fp16utils import Fp16OptimizerHook
    return Fp16OptimizerHook(loss_scale=dict(HOOK_SCALE), coalesce=coalesce,
                             bucket_size_mb=bucket_size_mb, distributed=distributed,
                             dtype=dtype)


def no_sync_dtype(backend: str) -> torch.dtype:
    """float16 where the CPU trains it with ``backend`` here, else bfloat16."""
    lacks = _caps.cpu_lacks(torch.float16, 'native' if backend == 'native' else None)
    return torch.float16 if lacks is None else torch.bfloat16


_gloo_dtypes: Dict[torch.dtype, bool] = {}


def gloo_takes(dtype: torch.dtype) -> bool:
    """Whether the process group broadcasts ``dtype`` tensors (collective: every rank asks)."""
    import torch.distributed as dist
    if dtype not in _gloo_dtypes:
        # A group of its own: a refused collective must not spoil the main group.
        probe_group = dist.new_group()
        try:
            dist.broadcast(torch.ones(1, dtype=dtype), 0, group=probe_group)
            _gloo_dtypes[dtype] = True
        except RuntimeError:
            _gloo_dtypes[dtype] = False
    return _gloo_dtypes[dtype]


def float16_or_skip(backend: Optional[str], scenario: Callable[[], Dict[str, Any]]
                    ) -> Dict[str, Any]:
    """Run a float16 (loss scaling) scenario, or say why this CPU cannot: ``{'skip': why}``."""
    lacks = _caps.cpu_lacks(torch.float16, 'native' if backend == 'native' else None)
    return {'skip': lacks} if lacks is not None else scenario()


def run_allreduce(coalesce: bool, bucket_size_mb: float, rank: int) -> Dict[str, Any]:
    """The legacy hook's own master-gradient all-reduce, on a plain (non-DDP) model.

    The legacy backend is chosen the way a torch < 1.6 process would choose it.
    """
    with simulated_torch('1.5.0'):
        model = R.Net(seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        hook = allreduce_hook(coalesce, bucket_size_mb)
        runner = R.MiniRunner(model, optimizer, [hook], max_iters=DIST_STEPS, meta={})
        data = allreduce_data(rank)
        log: List[Tuple[int, str, int]] = []
        skipped: List[int] = []
        with count_collectives(log, lambda: runner.iter):
            for i in range(DIST_STEPS):
                runner.run(data, R.mse, until=i + 1)
                skipped.append(hook.skipped_steps)
        return {'backend': hook.backend, 'collectives': log, 'skipped': skipped,
                'scales': list(hook.scale_history), 'final': clone_state(model, optimizer)}


def run_no_sync(backend: str, sync_every_step: bool, rank: int) -> Dict[str, Any]:
    """accumulative_counts=2 under DDP; counts no_sync entries and DDP bucket all-reduces.

    With ``sync_every_step`` the wrapper is handed the inner module (which has
    no ``no_sync``), so DDP all-reduces after every backward pass.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from fp16utils import AmpOptimWrapper
    dtype = no_sync_dtype(backend)
    if backend == 'legacy' and not gloo_takes(dtype):  # DDP then holds the converted model
        return {'skip': f'gloo cannot broadcast {_caps.NAMES[dtype]} tensors in this torch'}
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=512.0, backend=backend, model=model,
                              accumulative_counts=2, dtype=dtype)
    ddp = _ddp(model)
    comm = {'calls': 0}

    def counting_allreduce(state, bucket):  # no annotations: DDP checks them
        state['calls'] += 1
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(comm, counting_allreduce)
    entered = {'calls': 0}
    original_no_sync = ddp.no_sync

    @contextlib.contextmanager
    def counting_no_sync() -> Any:
        entered['calls'] += 1
        with original_no_sync():
            yield

    ddp.no_sync = counting_no_sync
    wrapper.initialize_count_status(ddp, 0, NO_SYNC_STEPS)
    context_model = ddp.module if sync_every_step else ddp
    per_iter_comm, per_iter_no_sync = [], []
    pending = None
    for i, (x, y) in enumerate(no_sync_data(rank)):
        before = comm['calls']
        with wrapper.optim_context(context_model):
            out = ddp(x)
        wrapper.update_params((out.float() - y).pow(2).mean())
        per_iter_comm.append(comm['calls'] - before)
        per_iter_no_sync.append(entered['calls'])
        if i == 0:  # accumulating: the gradient of this rank's first batch, synced or not
            pending = model.fc1.weight.grad.detach().clone()
    return {'comm': per_iter_comm, 'no_sync': per_iter_no_sync, 'pending_grad': pending,
            'skipped': wrapper.skipped_steps, 'final': clone_state(model, optimizer)}


class _SometimesUsedHead(nn.Module):
    """:class:`Net` plus a head that only some ranks use (its gradient is None elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = R.Net(seed=0)
        self.head = nn.Linear(4, 4)
        self.use_head = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        if self.use_head:
            out = out + self.head(out.to(self.head.weight.dtype)).float()
        return out


def run_unused_param(rank: int) -> Dict[str, Any]:
    """The legacy hook's own all-reduce when a parameter has a gradient on rank 0 only."""
    with simulated_torch('1.5.0'):
        model = _SometimesUsedHead()
        model.use_head = rank == 0
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = allreduce_hook(coalesce=True, bucket_size_mb=-1, dtype=_caps.LEGACY_LOW)
        runner = R.MiniRunner(model, optimizer, [hook], max_iters=2, meta={})
        runner.run(R.make_data(2, seed=400 + rank), R.mse)
        return {'skipped': hook.skipped_steps, 'final': clone_state(model, optimizer)}


def run_sharded_overflow(use_fsdp: bool, rank: int) -> Dict[str, Any]:
    """No DDP (gradients as FSDP leaves them: each rank its own); rank 1 overflows once.

    With ``use_fsdp=True`` the ranks agree on the skip (the found-inf flag is
    all-reduced); without it, and with ``agree_across_ranks=False``, only rank 1 skips.
    """
    from fp16utils import AmpOptimWrapper
    model = R.Net(seed=0)
    wrapper = AmpOptimWrapper(512.0, use_fsdp=use_fsdp,
                              optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                              agree_across_ranks=None if use_fsdp else False)
    for i, (x, y) in enumerate(overflow_data(rank)):
        with wrapper.optim_context(model):
            loss = R.mse(model, (x, y))
        if rank == 1 and i == DIST_FAULT_ITER:
            loss = loss * INF
        wrapper.update_params(loss)
    return {'skipped': wrapper.skipped_steps}


def run_floor_raise(rank: int) -> Dict[str, Any]:
    """No DDP; rank 1 overflows at iterations 1 and 2 (the second with the scale at its
    floor, ``at_min_scale='raise'``): every rank raises at the same iteration."""
    from fp16utils import AmpOptimWrapper
    model = R.Net(seed=0)
    wrapper = AmpOptimWrapper(dict(init_scale=4.0, min_scale=2.0, at_min_scale='raise'),
                              optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    raised, unchanged = None, False
    for i, (x, y) in enumerate(overflow_data(rank)):
        with wrapper.optim_context(model):
            loss = R.mse(model, (x, y))
        if rank == 1 and i in (1, 2):
            loss = loss * INF
        before = [p.detach().clone() for p in model.parameters()]
        try:
            wrapper.update_params(loss)
        except FloatingPointError as err:
            raised = (i, str(err).split(':')[0])
            unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
            break
    return {'raised': raised, 'unchanged': unchanged, 'scale': wrapper.loss_scale,
            'skipped': wrapper.skipped_steps}


DIST_SCENARIOS: Dict[str, Callable[[int], Dict[str, Any]]] = {}
DIST_SCENARIOS['floor-raise'] = lambda rank: float16_or_skip(
    'native', lambda: run_floor_raise(rank))
for _fsdp in (True, False):
    DIST_SCENARIOS[f'sharded-{_fsdp}'] = lambda rank, f=_fsdp: float16_or_skip(
        'native', lambda: run_sharded_overflow(f, rank))
for _style in ('wrapper', 'hook'):
    for _backend in ('native', 'legacy'):
        for _inject in ('input', 'grad'):
            DIST_SCENARIOS[f'overflow-{_style}-{_backend}-{_inject}'] = (
                lambda rank, s=_style, b=_backend, j=_inject: float16_or_skip(
                    b, lambda: run_overflow(s, b, j, rank)))
for _coalesce, _bucket in ALLREDUCE_SETTINGS:
    DIST_SCENARIOS[f'allreduce-{_coalesce}-{_bucket}'] = (
        lambda rank, c=_coalesce, b=_bucket: float16_or_skip(
            'legacy', lambda: run_allreduce(c, b, rank)))
for _backend in ('native', 'legacy'):
    for _every in (False, True):
        DIST_SCENARIOS[f'nosync-{_backend}-{"every" if _every else "accumulate"}'] = (
            lambda rank, b=_backend, e=_every: run_no_sync(b, e, rank))


#: Scenario groups, one launch each: a group whose collectives go wrong cannot spoil another.
DIST_GROUPS: Dict[str, Dict[str, Callable[[int], Dict[str, Any]]]] = {
    'main': DIST_SCENARIOS,
    'unused-param': {'unused-param': run_unused_param},
}


def dist_main(rank: int, world_size: int, init_file: str, out_dir: str,
              group: str = 'main') -> int:
    import logging

    import torch.distributed as dist
    logging.disable(logging.WARNING)  # the skip warnings are tested in test_faults.py
    try:
        dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    except Exception as err:  # noqa: BLE001 - any failure to start means: skip
        print(f'could not start a gloo process group: {err!r}', file=sys.stderr)
        return EXIT_NO_GLOO
    results: Dict[str, Any] = {}
    status = 0
    try:
        for name, scenario in DIST_GROUPS[group].items():
            results[name] = scenario(rank)
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
        results['error'] = traceback.format_exc()
        print(results['error'], file=sys.stderr)
        status = EXIT_FAILED
    final = os.path.join(out_dir, f'rank{rank}.pt')
    torch.save(results, final + '.tmp')
    os.replace(final + '.tmp', final)  # the parent reads a complete file or none
    if status == 0:
        try:
            dist.barrier()  # no rank tears the group down while another still uses it
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - another rank failed: the parent shows both logs
            traceback.print_exc()
            status = EXIT_FAILED
    return status


# --------------------------------------------------------------------------- resume

RESUME_STEPS = 8
#: data[RESUME_FAULT] overflows float16, so iteration RESUME_FAULT + 1 is skipped.
RESUME_FAULT = 2


def resume_data() -> List[Tuple[torch.Tensor, torch.Tensor]]:
    data = R.make_data(RESUME_STEPS, seed=7)
    data[RESUME_FAULT] = R.overflow_batch()
    return data


class _ResumeProbe:
    """A runner hook after the fp16 hook: notes the scale it resumed with, restores grads."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.grads: Optional[List[Optional[torch.Tensor]]] = None
        self.start_scale: Optional[float] = None

    def before_run(self, runner: Any) -> None:
        if self.start_scale is None:
            self.start_scale = runner.hooks[0].loss_scale
        if self.grads is not None:
            set_grads(self.model, self.grads)
            self.grads = None

    def before_train_iter(self, runner: Any) -> None:
        pass

    def after_train_iter(self, runner: Any) -> None:
        pass

    def after_run(self, runner: Any) -> None:
        pass


def pending_grads(model: nn.Module) -> List[Optional[torch.Tensor]]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def set_grads(model: nn.Module, grads: List[Optional[torch.Tensor]]) -> None:
    for p, g in zip(model.parameters(), grads):
        p.grad = None if g is None else g.to(p.dtype).clone()


class Trainer:
    """One training setup of either style, with the same save / resume / run interface.

    ``style`` is ``'wrapper'`` (1.x ``AmpOptimWrapper``, resumed the way MMEngine
    does it: ``load_state_dict`` then ``initialize_count_status(model, iter,
    max_iters)``) or ``'hook'`` (0.x ``Fp16OptimizerHook`` or
    ``GradientCumulativeFp16OptimizerHook`` on the minimal runner, resumed from
    an mmcv-style checkpoint with ``meta``).
    """

    def __init__(self, style: str, backend: str, accumulate: int = 1, seed: int = 0,
                 dtype: Optional[torch.dtype] = None) -> None:
        self.style = style
        self.model = R.Net(seed=seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.iter = 0
        if style == 'wrapper':
            from fp16utils import AmpOptimWrapper
            self.wrapper = AmpOptimWrapper(
                self.optimizer, backend=backend, model=self.model,
                loss_scale=dict(init_scale=512.0, growth_interval=2),
                clip_grad=dict(max_norm=1.0), accumulative_counts=accumulate, dtype=dtype)
            self.wrapper.initialize_count_status(self.model, 0, RESUME_STEPS)
        else:
            from fp16utils import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook
            kwargs = dict(backend=backend, grad_clip=dict(max_norm=1.0), dtype=dtype,
                          loss_scale=dict(init_scale=512.0, mode='dynamic', scale_window=2))
            if accumulate > 1:
                self.hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=accumulate,
                                                                **kwargs)
            else:
                self.hook = Fp16OptimizerHook(**kwargs)
            self.probe = _ResumeProbe(self.model)
            self.runner = R.MiniRunner(self.model, self.optimizer, [self.hook, self.probe],
                                       max_iters=RESUME_STEPS, meta={})

    def run(self, data: List[Any], stop: int = RESUME_STEPS,
            on_update: Optional[Callable[[int], None]] = None) -> None:
        """Train up to iteration ``stop``; ``on_update(iteration)`` at each optimizer update."""
        optimizer = self.optimizer
        if on_update is not None:  # skipped steps never reach optimizer.step
            original = optimizer.step

            def step(*args: Any, **kwargs: Any) -> Any:
                on_update(self.runner.iter + 1 if self.style == 'hook' else
                          self.wrapper.inner_count)
                return original(*args, **kwargs)

            optimizer.step = step
        try:
            if self.style == 'wrapper':
                wrapper, model = self.wrapper, self.model
                while self.iter < stop:
                    x, y = data[self.iter]
                    with wrapper.optim_context(model):
                        out = model(x)
                    wrapper.update_params((out.float() - y).pow(2).mean())
                    self.iter += 1
            else:
                self.runner.run(data, R.mse, until=stop)
                self.iter = self.runner.iter
        finally:
            if on_update is not None:
                del optimizer.step

    def checkpoint(self) -> Dict[str, Any]:
        """What a user saves with torch.save (plus the pending gradients, used on request)."""
        if self.style == 'wrapper':
            ckpt = {'model': self.model.state_dict(), 'optim': self.wrapper.state_dict(),
                    'iter': self.iter}
        else:
            runner = self.runner
            ckpt = {'state_dict': self.model.state_dict(),
                    'optimizer': self.optimizer.state_dict(), 'meta': runner.meta,
                    'iter': runner.iter}
        ckpt['pending_grads'] = pending_grads(self.model)
        return ckpt

    def resume(self, ckpt: Dict[str, Any], restore_grads: bool = False) -> None:
        grads = ckpt['pending_grads'] if restore_grads else None
        if self.style == 'wrapper':
            self.model.load_state_dict(ckpt['model'])
            self.wrapper.load_state_dict(ckpt['optim'])
            self.iter = ckpt['iter']
            self.wrapper.initialize_count_status(self.model, self.iter, RESUME_STEPS)
            if grads is not None:
                set_grads(self.model, grads)
        else:
            self.model.load_state_dict(ckpt['state_dict'])
            self.optimizer.load_state_dict(ckpt['optimizer'])
            self.runner.meta = ckpt['meta']
            self.runner.iter = self.iter = ckpt['iter']
            self.probe.grads = grads  # put back after the hook's before_run

    def scaler_state(self) -> Dict[str, Any]:
        if self.style == 'wrapper':
            return dict(self.wrapper.state_dict()['loss_scaler'])
        return dict(self.runner.meta['fp16']['loss_scaler'])

    @property
    def loss_scale(self) -> float:
        return (self.wrapper if self.style == 'wrapper' else self.hook).loss_scale

    def start_scale(self) -> Optional[float]:
        """The scale the last run started from (the hook loads its state in before_run)."""
        return self.loss_scale if self.style == 'wrapper' else self.probe.start_scale

    def result(self) -> Dict[str, Any]:
        return {'final': clone_state(self.model, self.optimizer),
                'scaler': self.scaler_state(), 'loss_scale': self.loss_scale,
                'iter': self.iter,
                'inner_count': self.wrapper.inner_count if self.style == 'wrapper' else None}


def resume_main(manifest_path: str) -> int:
    """Continue every checkpoint of the manifest in this (fresh) process."""
    import logging
    logging.disable(logging.WARNING)
    manifest = json.loads(Path(manifest_path).read_text())
    torch.set_num_threads(manifest['threads'])
    data = resume_data()
    for job in manifest['jobs']:
        trainer = Trainer(job['style'], job['backend'], job['accumulate'], seed=99)
        ckpt = torch.load(job['checkpoint'])  # weights_only: tensors and plain data
        trainer.resume(ckpt, restore_grads=job['restore_grads'])
        resumed_scale = trainer.loss_scale
        steps: List[int] = []
        trainer.run(data, on_update=steps.append)
        if trainer.style == 'hook':
            resumed_scale = trainer.start_scale()
        torch.save({**trainer.result(), 'resumed_scale': resumed_scale, 'updates': steps},
                   job['out'])
    return 0


def main(argv: List[str]) -> int:
    if argv[:1] == ['dist'] and len(argv) in (5, 6) and argv[5:] in ([], *(
            [g] for g in DIST_GROUPS)):
        torch.set_num_threads(1)
        status = dist_main(int(argv[1]), int(argv[2]), argv[3], argv[4], *argv[5:])
        # Exit without the interpreter's teardown: the results are written and the group
        # destroyed, but gloo's threads (gloo_tcp_loop, pt_gloo_runloop) outlive
        # destroy_process_group, and a teardown that races them can abort the process
        # (SIGABRT) after its work is done. Nothing is left to clean up here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if argv[:1] == ['resume'] and len(argv) == 2:
        return resume_main(argv[1])
    print('usage: _dist_worker.py dist RANK WORLD INIT_FILE OUT_DIR [GROUP] | resume MANIFEST',
          file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
