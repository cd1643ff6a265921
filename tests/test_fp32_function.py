"""fp32_function: functions and autograd Functions run in float32, on any device and backend."""

from __future__ import annotations

import collections
import functools
import inspect

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

import fp16utils
from fp16utils import fp32_function

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
LOW = _caps.LOW
Pair = collections.namedtuple('Pair', 'a b')


def record(seen):
    """A function that records the dtypes and the CPU autocast state it runs with."""
    def fn(*args, **kwargs):
        leaves = [*args, *kwargs.values()]
        seen.append(([getattr(v, 'dtype', type(v).__name__) for v in leaves],
                     _caps.autocast_now('cpu')[0]))
        return args[0] * 2 if args else kwargs
    return fn


# ---------------------------------------------------------------- what it casts


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_low_precision_arguments_become_float32_others_stay(dtype):
    seen = []
    wrapped = fp32_function(record(seen))
    out = wrapped(torch.ones(2, dtype=dtype), torch.ones(2, dtype=torch.int64),
                  torch.ones(2, dtype=torch.float64), 3, 'name', None,
                  k=torch.ones(1, dtype=dtype))
    assert seen == [([F32, torch.int64, torch.float64, 'int', 'str', 'NoneType', F32],
                     False)]
    assert out.dtype == F32  # cast_output=False: as the function returns it


def test_containers_are_cast_as_cast_tensor_type_casts_them():
    got = {}

    @fp32_function
    def fn(items, mapping, pair):
        got.update(items=items, mapping=mapping, pair=pair)
        return items[0]

    h = torch.ones(1, dtype=F16)
    fn([h, torch.ones(1, dtype=torch.int32)], {'x': (h, h)}, Pair(h, 1.5))
    assert [t.dtype for t in got['items']] == [F32, torch.int32]
    assert type(got['mapping']['x']) is tuple and got['mapping']['x'][1].dtype == F32
    assert type(got['pair']) is Pair and got['pair'].a.dtype == F32 and got['pair'].b == 1.5


@pytest.mark.parametrize('cast_output, want', [
    (False, F32), (None, F32), (True, BF16), (F16, F16), ('float16', F16)])
def test_cast_output_chooses_the_dtype_of_float32_outputs(cast_output, want):
    @fp32_function(cast_output=cast_output)
    def fn(x):
        return {'out': x + 1, 'index': torch.arange(2), 'double': x.double()}

    out = fn(torch.ones(2, dtype=BF16))
    assert (out['out'].dtype, out['index'].dtype, out['double'].dtype) == (
        want, torch.int64, torch.float64)


def test_cast_output_true_takes_the_first_low_input_even_nested_and_none_without():
    fn = fp32_function(lambda *a: torch.zeros(1), cast_output=True)
    assert fn(torch.ones(1), [torch.ones(1, dtype=F16)]).dtype == F16
    assert fn({'a': torch.ones(1, dtype=BF16)}, torch.ones(1, dtype=F16)).dtype == BF16
    assert fn(torch.ones(1), 2).dtype == F32  # no low input: nothing to go back to


@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES, ids=lambda d: _caps.NAMES[d])
def test_autocast_is_off_inside_and_back_on_after(dtype):
    seen = []
    wrapped = fp32_function(record(seen))
    lin = nn.Linear(2, 2)
    with torch.autocast('cpu', dtype=dtype):
        x = lin(torch.ones(1, 2))
        assert x.dtype == dtype
        out = wrapped(x, torch.ones(1, 2))  # float32 arguments too: autocast is off
        assert _caps.autocast_now('cpu') == (True, dtype)
    assert seen == [([F32, F32], False)] and out.dtype == F32


def test_float32_arguments_outside_autocast_are_passed_as_they_are():
    x = torch.ones(2)
    fn = fp32_function(lambda t: t)
    assert fn(x) is x


def test_any_device_meta_tensors_are_cast_too():
    fn = fp32_function(lambda t: t + 1, cast_output=True)
    out = fp32_function(lambda t: t)(torch.empty(3, dtype=F16, device='meta'))
    assert out.device.type == 'meta' and out.dtype == F32
    assert fn(torch.empty(3, dtype=BF16, device='meta')).dtype == BF16


def test_gradients_reach_the_inputs_in_their_own_dtype():
    x = torch.tensor([1.0, 2.0], dtype=BF16, requires_grad=True)
    w = torch.tensor([3.0, 4.0], requires_grad=True)

    @fp32_function(cast_output=True)
    def mul(a, b):
        assert a.dtype == F32
        return a * b

    mul(x, w).sum().backward()
    assert x.grad.dtype == BF16 and x.grad.tolist() == [3.0, 4.0]
    assert w.grad.dtype == F32 and w.grad.tolist() == [1.0, 2.0]


# -------------------------------------------------------------- autograd Functions


class Square(torch.autograd.Function):
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        Square.seen.append(('forward', x.dtype, _caps.autocast_now('cpu')[0]))
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        Square.seen.append(('backward', grad.dtype))
        return 2 * x * grad


class DecoratedSquare(torch.autograd.Function):
    """Like torch.amp.custom_fwd(cast_inputs=torch.float32), on any device and backend."""

    seen: list = []

    @staticmethod
    @fp32_function(cast_output=True)
    def forward(ctx, x):
        DecoratedSquare.seen.append(('forward', x.dtype, _caps.autocast_now('cpu')[0]))
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @fp32_function
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        DecoratedSquare.seen.append(('backward', grad.dtype))
        return 2 * x * grad


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_a_wrapped_apply_runs_forward_and_backward_in_float32(dtype):
    Square.seen.clear()
    x = torch.tensor([1.5, -2.0], dtype=dtype, requires_grad=True)
    square = fp32_function(Square.apply, cast_output=True)
    assert square.__name__ == 'apply'
    out = square(x)
    out.sum().backward()
    assert out.dtype == dtype and out.tolist() == [2.25, 4.0]
    assert Square.seen == [('forward', F32, False), ('backward', F32)]
    assert x.grad.dtype == dtype and x.grad.tolist() == [3.0, -4.0]


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_decorated_forward_and_backward_work_outside_and_inside_autocast(dtype):
    for context in (torch.autocast('cpu', dtype=LOW), torch.autocast('cpu', enabled=False)):
        DecoratedSquare.seen.clear()
        x = torch.tensor([1.5, -2.0], dtype=dtype, requires_grad=True)
        with context:
            out = DecoratedSquare.apply(x)
        out.sum().backward()
        assert out.dtype == dtype and out.tolist() == [2.25, 4.0]
        # The backward gets the output's dtype and casts it: float32 all through.
        assert DecoratedSquare.seen == [('forward', F32, False), ('backward', F32)]
        assert x.grad.dtype == dtype and x.grad.tolist() == [3.0, -4.0]


def test_torch_custom_fwd_casts_only_under_autocast_and_fp32_function_always():
    """Why the wrapper exists: custom_fwd(cast_inputs=...) leaves a half model's inputs half
    (and on torch < 2.4 it is torch.cuda.amp.custom_fwd, for CUDA only)."""
    custom_fwd = getattr(torch.amp, 'custom_fwd', None)
    if custom_fwd is None or 'device_type' not in custom_fwd.__code__.co_varnames:
        pytest.skip('torch.amp.custom_fwd(device_type=...) is torch >= 2.4')
    seen = []

    class Custom(torch.autograd.Function):
        @staticmethod
        @custom_fwd(device_type='cpu', cast_inputs=F32)
        def forward(ctx, x):
            seen.append(x.dtype)
            return x

    Custom.apply(torch.ones(1, dtype=F16))  # no autocast: the legacy backend's case
    assert seen == [F16]
    fp32_function(Custom.apply)(torch.ones(1, dtype=F16))
    assert seen == [F16, F32]


# -------------------------------------------------------------------- errors


class Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x


@pytest.mark.parametrize('bad, match', [
    (5, r"fp32_function\(fn\): fn must be a function.*got int \(5\)"),
    ('roi_align', r"got str \('roi_align'\)"),
    (Fn, r'autograd Function class Fn; wrap its apply \(fp32_function\(Fn.apply\)\)'),
    (nn.Linear(1, 1), r'got the module Linear.*keep_fp32'),
    (staticmethod(len), r'put @staticmethod above @fp32_function'),
])
def test_what_it_cannot_wrap_is_a_type_error_naming_it(bad, match):
    with pytest.raises(TypeError, match=match):
        fp32_function(bad)


def test_generators_and_a_bad_cast_output_are_refused_when_wrapping():
    def gen(x):
        yield x

    with pytest.raises(TypeError, match='gen: it is a generator or async function'):
        fp32_function(gen)
    with pytest.raises(ValueError, match=r'cast_output=\.\.\.\): Unsupported low-precision '
                                         r"dtype 'int8'"):
        fp32_function(len, cast_output='int8')
    with pytest.raises(TypeError, match=r'got bool \(True\)'):
        fp32_function(True)  # @fp32_function(True): cast_output must be named


def test_it_is_a_public_name_and_keeps_the_wrapped_name():
    assert fp16utils.fp32_function is fp32_function and 'fp32_function' in fp16utils.__all__

    def roi_align(x):
        """Doc."""
        return x

    wrapped = fp32_function(roi_align)
    assert (wrapped.__name__, wrapped.__doc__) == ('roi_align', 'Doc.')
    assert inspect.signature(wrapped) == inspect.signature(roi_align)
    assert not hasattr(wrapped, '__wrapped__')  # TorchScript would compile roi_align itself
    assert fp32_function()(roi_align)(torch.ones(1, dtype=F16)).dtype == F32
    partial = fp32_function(functools.partial(torch.add, other=torch.ones(1)))
    assert partial(torch.ones(1, dtype=F16)).dtype == F32


# --------------------------------------------------------- torch.compile, jit


class Cube(torch.autograd.Function):
    """Without side effects: dynamo traces a Function whose forward appends to no list."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


class DecoratedCube(Cube):
    forward = staticmethod(fp32_function(Cube.forward, cast_output=True))
    backward = staticmethod(fp32_function(Cube.backward))


def _compile_works() -> str:
    try:
        torch.compile(lambda x: x + 1, backend='eager')(torch.ones(1))
    except Exception as err:  # noqa: BLE001 - whatever stops it: no torch.compile here
        return str(err).splitlines()[0]
    return ''


@pytest.mark.parametrize('backend', ['eager', 'aot_eager'])
def test_compiled_callers_trace_in_one_graph_and_give_the_eager_values(backend):
    why = _compile_works()
    if why:
        pytest.skip(f'torch.compile does not run here: {why}')
    torch._dynamo.reset()
    lin = nn.Linear(3, 3)
    square = fp32_function(Cube.apply, cast_output=True)
    mul = fp32_function(torch.mul, cast_output=True)

    def step(x):
        y = lin(x)
        return mul(square(y), DecoratedCube.apply(y.to(LOW))) + 1

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=LOW):
        want = step(x)
        got = torch.compile(step, backend=backend, fullgraph=True)(x)  # no graph break
    torch._dynamo.reset()
    assert got.dtype == want.dtype == LOW and torch.equal(got, want)


@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # torch.jit is deprecated
def test_jit_trace_records_the_casts_and_script_is_refused_not_bypassed():
    fn = fp32_function(torch.cdist, cast_output=True)  # cdist has no CPU half kernel
    a = torch.randn(3, 2).to(F16)

    def dist(x):
        return fn(x, x)

    traced = torch.jit.trace(dist, (a,))
    assert traced(a).dtype == F16 and torch.equal(traced(a), dist(a))
    # Scripted, it would have to drop the casts (a __wrapped__ would let it compile the
    # function underneath, silently in half): it is refused instead.
    with pytest.raises(torch.jit.frontend.NotSupportedError, match='variable number'):
        torch.jit.script(fp32_function(dist))
