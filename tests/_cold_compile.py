"""Work done in a fresh process for the cold compile tier (tests/test_compile_cold.py).

Run as a script by the tests, never collected by pytest itself:

``python _cold_compile.py GROUP OUT_FILE``
    runs every case of the group (:data:`GROUPS`) in three phases, so that each
    compiled first call meets a process where nothing was warmed: first every
    case is compiled (``fullgraph=True``) and called once, then each is traced
    again by ``torch._dynamo.explain``, then run eagerly (the reference). A case
    whose cold compile failed is compiled once more, now warm, which tells a
    cold-start bug from a limitation of this torch. Everything is written to
    OUT_FILE with ``torch.save``: ``{'skip': reason}`` where torch.compile does
    not run at all, else ``{'cases': {name: result}}`` (see :func:`_run_group`).

The environment (``FP16UTILS_BACKEND``) is set by the caller.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from fp16utils import auto_fp16, force_fp32

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
#: Training steps of the AmpOptimWrapper cases (each gives prediction, loss, hidden).
STEPS = 10


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f'{type(err).__name__}: {lines[0] if lines else ""}'[:300]


class Net(nn.Module):
    """``fp16_enabled`` on the class: nothing wrapped, nothing probed before the trace."""

    fp16_enabled = True

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.fp16_dtype = dtype

    @auto_fp16()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    @force_fp32(apply_to=('pred',))
    def loss(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # A matrix product: its dtype tells whether autocast was really off.
        return torch.mm(pred, target.t()).mean()


class Neck(nn.Module):
    """A decorated forward that takes a list of feature maps and a keyword (mmdet's necks)."""

    fp16_enabled = True

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.fp16_dtype = dtype

    @auto_fp16(apply_to=('feats',), out_fp32=True)
    def forward(self, feats: List[torch.Tensor], scale: float = 1.0) -> List[torch.Tensor]:
        return [self.fc(f) * scale for f in feats]


class Wrapped(Net):
    """The instance flag, off until wrap_fp16_model turns it on."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__(dtype)
        self.fp16_enabled = False
        self.norm = nn.GroupNorm(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # a float32 norm after the head
        return self.norm(super().forward(x))


def _inputs(seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)


def _model(cls: type, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return cls(dtype)


# A case: build() -> (function, args), called once per phase (fresh objects each time),
# and the dtypes its outputs must have. A case that trains returns a `steps` runner.


def _autocast_case(dtype: torch.dtype, half_model: bool = False
                   ) -> Callable[[], Tuple[Callable[..., Any], tuple]]:
    def build() -> Tuple[Callable[..., Any], tuple]:
        model = _model(Net, dtype)
        # Legacy: a model converted by hand; the decorator casts its inputs, no autocast.
        return (model.to(dtype) if half_model else model), (_inputs()[0],)
    return build


def _neck_case() -> Tuple[Callable[..., Any], tuple]:
    model = _model(Neck, BF16)
    x, _ = _inputs()

    def run(x: torch.Tensor) -> List[torch.Tensor]:
        return model([x, x * 2], scale=0.5)
    return run, (x,)


def _force_fp32_case() -> Tuple[Callable[..., Any], tuple]:
    model = _model(Net, BF16)
    pred, target = _inputs()
    low = pred @ torch.ones(8, 4)

    def loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with torch.autocast('cpu', dtype=BF16):  # force_fp32 must turn it off
            return model.loss(pred, target)
    return loss, (low.bfloat16(), target)


def _keep_fp32_case() -> Tuple[Callable[..., Any], tuple]:
    from fp16utils import keep_fp32

    torch.manual_seed(0)
    model = keep_fp32(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)), '1')

    def run(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast('cpu', dtype=BF16):
            return model[0](x), model(x)
    return run, (_inputs()[0],)


def _wrap_case(dtype: torch.dtype, backend: Optional[str]
               ) -> Callable[[], Tuple[Callable[..., Any], tuple]]:
    def build() -> Tuple[Callable[..., Any], tuple]:
        from fp16utils import wrap_fp16_model

        model = wrap_fp16_model(_model(Wrapped, dtype), dtype=dtype, backend=backend)

        def step(x: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
            pred = model(x)
            return pred, model.loss(pred, target)
        return step, _inputs()
    return build


def _amp_case(dtype: torch.dtype, fp32: bool = False
              ) -> Callable[[], Tuple[Callable[..., Any], tuple]]:
    """AmpOptimWrapper: the forward and loss under optim_context compiled, the update eager.

    Each step gives the prediction, the loss and the second layer's output (float32
    where ``fp32`` keeps that layer in float32 through ``fp32_modules``).
    """
    def build() -> Tuple[Callable[..., Any], tuple]:
        from fp16utils import AmpOptimWrapper

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
        wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  loss_scale='dynamic', dtype=dtype,
                                  **(dict(fp32_modules=['1'], model=model) if fp32 else {}))

        def forward(x: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, ...]:
            with wrapper.optim_context(model):
                pred = model(x)
                hidden = model[1](model[0](x))
            return pred, ((pred.float() - target) ** 2).mean(), hidden

        def steps(fwd: Callable[..., Any]) -> List[torch.Tensor]:
            out = []
            # One batch, more steps than dynamo compiles a function before it gives up
            # (8): a guard that changes at each step would fail the run; the loss must fall.
            for _ in range(STEPS):
                pred, loss, hidden = fwd(*_inputs())
                wrapper.update_params(loss)
                out += [pred.detach(), loss.detach(), hidden.detach()]
            out += [p.detach().clone() for p in model.parameters()]
            return out + [torch.tensor(wrapper.loss_scale), torch.tensor(wrapper.skipped_steps)]

        forward.steps = steps  # type: ignore[attr-defined]
        return forward, _inputs()
    return build


def _export_case() -> Tuple[Callable[..., Any], tuple]:
    return _model(Net, BF16).eval(), (_inputs()[0],)  # nothing wrapped: nothing decided


#: Cases per group: name -> (build, output dtypes, what it needs). A group is one process.
GROUPS: Dict[str, Dict[str, Tuple[Callable[[], Any], Tuple[torch.dtype, ...], str]]] = {
    'native': {
        'auto_fp16-float16': (_autocast_case(F16), (F16,), 'autocast-float16'),
        'auto_fp16-bfloat16': (_autocast_case(BF16), (BF16,), 'autocast-bfloat16'),
        'auto_fp16-list-kwargs': (_neck_case, (F32, F32), 'autocast-bfloat16'),
        'force_fp32-loss': (_force_fp32_case, (F32,), 'autocast-bfloat16'),
        'keep_fp32': (_keep_fp32_case, (BF16, F32), 'autocast-bfloat16'),
        'wrap-native': (_wrap_case(BF16, 'native'), (BF16, F32), 'autocast-bfloat16'),
        'wrap-legacy-argument': (_wrap_case(BF16, 'legacy'), (BF16, F32), ''),
        'amp-step': (_amp_case(BF16), (BF16, F32, BF16), 'autocast-bfloat16'),
        'amp-step-float16': (_amp_case(F16), (F16, F32, F16), 'autocast-float16 grad-scaler'),
        'amp-step-fp32-modules': (_amp_case(BF16, fp32=True), (BF16, F32, F32),
                                  'autocast-bfloat16'),
        'export': (_export_case, (BF16,), 'autocast-bfloat16 export'),
    },
    'legacy-env': {
        'wrap-legacy-env': (_wrap_case(BF16, None), (BF16, F32), ''),
        'auto_fp16-legacy-env': (_autocast_case(BF16, half_model=True), (BF16,), ''),
    },
}


def _lacks(needs: str) -> Optional[str]:
    """Why this torch cannot run a case (None: it can): a capability or a torch limitation."""
    from fp16utils import _torch

    for need in needs.split():
        kind, _, name = need.partition('-')
        dtype = getattr(torch, name, None)
        if kind == 'autocast' and not _torch.autocast.autocast_supports('cpu', dtype):
            return f'torch.autocast does not support {name} on cpu here'
        if kind == 'grad' and not _torch.caps.grad_scaler_supports('cpu'):
            return 'torch has no GradScaler for cpu here'
    why = _limitation('fullgraph')
    if why is None and 'export' in needs.split():
        why = _limitation('export')
    return why


_LIMITS: Dict[str, Optional[str]] = {}


def _limitation(kind: str) -> Optional[str]:
    """A known torch limitation, found by trying the smallest thing that meets it (warm).

    ``'fullgraph'``: dynamo cannot trace a decorated module whole even after an
    eager call (what tests/test_compile.py skips on too); ``'export'``: torch.export
    cannot export an autocast region. Asked after the cold phases, once each.
    """
    if kind not in _LIMITS:
        import torch._dynamo

        from fp16utils import wrap_fp16_model

        class Probe(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fp16_enabled = False

            @auto_fp16(dtype=BF16)
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x * 2

        class Region(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                with torch.autocast('cpu', dtype=BF16):
                    return torch.mm(x, x)

        probe = wrap_fp16_model(Probe(), dtype=BF16, backend='native')
        probe(torch.ones(2))
        torch._dynamo.reset()
        try:
            if kind == 'fullgraph':
                torch.compile(probe, fullgraph=True, backend='eager')(torch.ones(2))
            else:
                _export(Region(), (torch.ones(2, 2),)).module()(torch.ones(2, 2))
            _LIMITS[kind] = None
        except Exception as err:  # noqa: BLE001 - torch's reason, shown in the skip
            what = ('torch.compile(fullgraph=True) cannot trace the decorators here, even '
                    'warm' if kind == 'fullgraph' else
                    'torch.export cannot export autocast regions here')
            _LIMITS[kind] = f'{what}: {_first_line(err)}'
        torch._dynamo.reset()
    return _LIMITS[kind]


def _export(model: nn.Module, args: tuple) -> Any:
    """``torch.export.export`` in strict mode (dynamo) where torch has the choice."""
    import inspect

    export = torch.export.export
    if 'strict' in inspect.signature(export).parameters:
        return export(model, args, strict=True)
    return export(model, args)


def _call(name: str, build: Callable[[], Any], how: str) -> Tuple[Any, Any]:
    """Build a case and run it one way: ``'compiled'``, ``'explain'`` or ``'eager'``."""
    import torch._dynamo

    fn, args = build()
    steps = getattr(fn, 'steps', None)
    if how == 'explain':
        explained = torch._dynamo.explain(fn)(*args)
        return (explained.graph_break_count, explained.graph_count,
                [str(r.reason)[:500] for r in explained.break_reasons])
    if name == 'export':
        if how == 'eager':
            return fn(*args), None
        return _export(fn, args).module()(*args), None
    if how == 'compiled':
        fn = torch.compile(fn, fullgraph=True,
                           backend='aot_eager' if steps is not None else 'eager')
    if steps is not None:  # and how many graphs dynamo made over the steps
        graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
        out = steps(fn)
        return out, torch._dynamo.utils.counters['stats']['unique_graphs'] - graphs
    return fn(*args), None


def _outputs(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach()]
    return [v.detach() for v in value]


def _run_group(group: str) -> Dict[str, Any]:
    """Each case: ``skip`` (why it cannot run here), or ``error`` (the cold compiled
    call's, with ``trace``), ``warm_error`` (after a failure: the same compiled after
    the eager run; None: it works then), ``breaks``/``graphs``/``reasons`` (explain),
    ``compiled``/``eager`` (outputs), ``dtypes`` (what the outputs must be),
    ``graphs_compiled`` (training cases: graphs dynamo made over all the steps); and
    ``imported``: the default backend and the dtypes whose autocast support on the
    CPU the import decided."""
    from fp16utils import _torch
    from fp16utils._torch import decisions as warm

    imported = {'default': _torch.versions._default,  # what importing fp16utils decided
                'autocast': [d for d in (F16, BF16) if warm.decided('cpu', d)]}
    try:
        import torch._dynamo
        torch.compile(lambda x: x + 1, backend='eager')(torch.ones(1))
    except Exception as err:  # noqa: BLE001 - whatever stops it: no torch.compile here
        return {'skip': f'torch.compile does not run here: {_first_line(err)}',
                'imported': imported}
    torch._dynamo.reset()
    cases = GROUPS[group]
    results: Dict[str, Dict[str, Any]] = {}
    for name, (build, dtypes, _) in cases.items():  # 1. each compiled, first call
        result = results[name] = {'dtypes': dtypes, 'error': None}
        try:
            out, result['graphs_compiled'] = _call(name, build, 'compiled')
            result['compiled'] = _outputs(out)
        except Exception as err:  # noqa: BLE001 - reported by the test
            result['error'] = _first_line(err)
            result['trace'] = traceback.format_exc()[-3000:]
    for name, result in results.items():  # 2. explain, still before any eager call
        if name == 'export':  # (torch.export has no explain: its first call is the test)
            continue
        torch._dynamo.reset()
        try:
            result['breaks'], result['graphs'], result['reasons'] = _call(
                name, cases[name][0], 'explain')
        except Exception as err:  # noqa: BLE001
            result['error'] = result['error'] or _first_line(err)
            result.setdefault('trace', traceback.format_exc()[-3000:])
    for name, (_, _, needs) in cases.items():  # asked only now: asking may warm things
        why = _lacks(needs)
        if why is not None:
            results[name] = {'skip': why}
    for name, result in results.items():  # 3. eager, the reference
        if 'skip' in result:
            continue
        try:
            result['eager'] = _outputs(_call(name, cases[name][0], 'eager')[0])
        except Exception as err:  # noqa: BLE001
            result['error'] = result['error'] or _first_line(err)
            result.setdefault('trace', traceback.format_exc()[-3000:])
    for name, result in results.items():  # a cold failure: does the same fail warm too?
        if result.get('error') is not None and 'eager' in result:
            torch._dynamo.reset()
            try:
                _call(name, cases[name][0], 'compiled')
                result['warm_error'] = None
            except Exception as err:  # noqa: BLE001
                result['warm_error'] = _first_line(err)
    return {'cases': results, 'imported': imported}


def main(argv: List[str]) -> int:
    group, out = argv
    torch.save(_run_group(group), out)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
