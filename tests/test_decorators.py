"""Tests for auto_fp16 and force_fp32."""

import contextlib
import copy
import inspect

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

import fp16utils
import fp16utils.decorators
from fp16utils import auto_fp16, force_fp32, wrap_fp16_model

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
#: The dtype the decorated methods run in: the default, float16, where CPU autocast has
#: it; else bfloat16, given to the test modules as their ``fp16_dtype``.
LOW = _caps.LOW
#: The other low dtype (one the decorator may name, unused as the run dtype).
OTHER = BF16 if LOW == F16 else F16
#: What the legacy backend converts a CPU model to here (it needs the kernels only).
LEGACY = F16 if _caps.CPU_F16 else BF16


def f32(n=2):
    return torch.arange(n, dtype=F32) + 0.5


def autocast_now():
    """(enabled, dtype) of CPU autocast, as the function body sees it."""
    return _caps.autocast_now('cpu')


class Recorder(nn.Module):
    """A module whose decorated methods record the arguments they receive."""

    def __init__(self, enabled=True):
        super().__init__()
        if enabled is not None:
            self.fp16_enabled = enabled
        if LOW != F16:  # where float16 is the default and autocast has it, keep the default
            self.fp16_dtype = LOW
        self.seen = None

    def record(self, **named):
        self.seen = dict(named, autocast=autocast_now())
        return named


# --------------------------------------------------------------------------- auto_fp16


class AutoAll(Recorder):
    @auto_fp16()
    def forward(self, x, y, n=None, *, k=None):
        return self.record(x=x, y=y, n=n, k=k)


def test_auto_fp16_all_args_cast():
    m = AutoAll()
    ids = torch.arange(3)
    nested = {'a': [f32()]}
    m(f32(), nested, ids, k=f32())
    seen = m.seen
    assert seen['x'].dtype == LOW
    assert seen['y']['a'][0].dtype == LOW
    assert seen['n'] is ids  # int tensors untouched, same object
    assert seen['k'].dtype == LOW  # keyword-only arguments too
    assert seen['autocast'] == (True, LOW)
    assert autocast_now()[0] is False  # restored afterwards


def test_auto_fp16_values_preserved():
    m = AutoAll()
    x = torch.tensor([0.5, -1.25, 3.0])
    m(x, None)
    assert torch.equal(m.seen['x'].float(), x)
    assert x.dtype == F32  # the caller's tensor is not modified


def test_auto_fp16_non_tensor_args_same_objects():
    m = AutoAll()
    half = torch.ones(1, dtype=F16)
    text, obj = 'text', object()
    m(half, text, obj, k=None)
    assert m.seen['x'] is half and m.seen['y'] is text and m.seen['n'] is obj


class AutoNamed(Recorder):
    @auto_fp16(apply_to=('x',))
    def forward(self, x, y):
        return self.record(x=x, y=y)


def test_auto_fp16_apply_to_names():
    m = AutoNamed()
    y = f32()
    m(f32(), y)
    assert m.seen['x'].dtype == LOW
    assert m.seen['y'] is y


def test_auto_fp16_positional_given_by_keyword():
    m = AutoNamed()
    y = f32()
    m(y=y, x=f32())
    assert m.seen['x'].dtype == LOW
    assert m.seen['y'] is y


def test_auto_fp16_keyword_only():
    class M(Recorder):
        @auto_fp16(apply_to=('scale',))
        def forward(self, x, *, scale, other=None):
            return self.record(x=x, scale=scale, other=other)

    m = M()
    x, other = f32(), f32()
    m(x, scale=f32(), other=other)
    assert m.seen['scale'].dtype == LOW
    assert m.seen['x'] is x and m.seen['other'] is other


def test_auto_fp16_positional_only():
    class M(Recorder):
        @auto_fp16(apply_to=('x',))
        def forward(self, x, /, y):
            return self.record(x=x, y=y)

    m = M()
    y = f32()
    m(f32(), y)
    assert m.seen['x'].dtype == LOW and m.seen['y'] is y


def test_auto_fp16_var_positional():
    class M(Recorder):
        @auto_fp16(apply_to=('rest',))
        def forward(self, x, *rest):
            return self.record(x=x, rest=rest)

    m = M()
    x, ids = f32(), torch.arange(2)
    m(x, f32(), ids, [f32()])
    assert m.seen['x'] is x
    rest = m.seen['rest']
    assert rest[0].dtype == LOW and rest[1] is ids and rest[2][0].dtype == LOW


def test_auto_fp16_none_casts_var_positional():
    class M(Recorder):
        @auto_fp16()
        def forward(self, *inputs):
            return self.record(inputs=inputs)

    m = M()
    m(f32(), f32())
    assert [t.dtype for t in m.seen['inputs']] == [LOW, LOW]


def test_auto_fp16_var_keyword():
    class M(Recorder):
        @auto_fp16(apply_to=('extra',))
        def forward(self, x, **extra):
            return self.record(x=x, extra=extra)

    m = M()
    x = f32()
    m(x=x, a=f32(), b=[f32()])
    assert m.seen['x'] is x  # named, and not in apply_to
    assert m.seen['extra']['a'].dtype == LOW
    assert m.seen['extra']['b'][0].dtype == LOW


def test_auto_fp16_name_reaching_var_keyword():
    # With **kwargs, a name the signature does not list can still arrive by keyword.
    class M(Recorder):
        @auto_fp16(apply_to=('gt',))
        def forward(self, x, **kwargs):
            return self.record(x=x, kwargs=kwargs)

    m = M()
    x, other = f32(), f32()
    m(x, gt=f32(), other=other)
    assert m.seen['kwargs']['gt'].dtype == LOW
    assert m.seen['kwargs']['other'] is other and m.seen['x'] is x


def test_auto_fp16_apply_to_single_string():
    class M(Recorder):
        @auto_fp16(apply_to='xy')
        def forward(self, xy, x, y):
            return self.record(xy=xy, x=x, y=y)

    m = M()
    x, y = f32(), f32()
    m(f32(), x, y)
    assert m.seen['xy'].dtype == LOW
    assert m.seen['x'] is x and m.seen['y'] is y  # not read as the names 'x', 'y'


def test_auto_fp16_out_fp32():
    class M(Recorder):
        @auto_fp16(out_fp32=True)
        def forward(self, x):
            return {'out': x * 2, 'ids': torch.arange(2), 'keep': x.double()}

    out = M()(f32())
    assert out['out'].dtype == F32
    assert torch.equal(out['out'], f32() * 2)
    assert out['ids'].dtype == torch.int64
    assert out['keep'].dtype == torch.float64


def test_auto_fp16_output_low_precision_without_out_fp32():
    class M(Recorder):
        @auto_fp16()
        def forward(self, x):
            return x * 2

    assert M()(f32()).dtype == LOW


def test_auto_fp16_out_fp32_bfloat16():
    class M(Recorder):
        @auto_fp16(out_fp32=True, dtype=BF16)
        def forward(self, x):
            return x, torch.ones(1, dtype=F16)

    out, half = M()(f32())
    assert out.dtype == F32
    assert half.dtype == F16  # only the run's own low dtype goes back to float32


# ------------------------------------------------- the positional fast path of auto_fp16


class AutoPositional(Recorder):
    """Every argument cast (apply_to=None): a call without keywords takes the fast path."""

    @auto_fp16()
    def forward(self, *args, **kwargs):
        self.seen = dict(args=args, kwargs=kwargs, autocast=autocast_now())
        return args[0] if args else None


def _mixed_args():
    """One argument of each kind the fast path tells apart, float32 ones marked."""
    return (f32(), torch.ones(2, dtype=F16), torch.arange(2), f32().double(), None, 3, 2.5,
            'text', (f32(), [{'t': f32(), 'i': torch.arange(1)}]), [torch.arange(2)])


def _expect(value):
    """What an argument must become: fp16utils.cast_tensor_type's answer (float32 -> LOW)."""
    return fp16utils.cast_tensor_type(value, F32, LOW)


def _same(got, want):
    """Equal structure, types, dtypes and values; tensors compared exactly."""
    if isinstance(want, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.dtype == want.dtype
                and torch.equal(got, want))
    if isinstance(want, dict):
        return type(got) is dict and got.keys() == want.keys() and all(
            _same(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    return got == want


def test_auto_fp16_fast_path_each_argument_as_cast_tensor_type():
    m = AutoPositional()
    args = _mixed_args()
    m(*args)
    seen = m.seen['args']
    assert len(seen) == len(args) and m.seen['kwargs'] == {}
    for got, arg in zip(seen, args):
        assert _same(got, _expect(arg)), (got, arg)
    assert [a.dtype for a in seen[:4]] == [LOW, F16, torch.int64, torch.float64]
    for i in (1, 2, 3, 4, 7, 9):  # nothing to cast inside: the very same object
        assert seen[i] is args[i]
    assert seen[8][1][0]['i'] is args[8][1][0]['i']  # int tensor deep inside: untouched
    assert m.seen['autocast'] == (True, LOW)
    assert autocast_now()[0] is False


def test_auto_fp16_fast_path_matches_the_keyword_path():
    """The same arguments, positional (fast path) or one given by keyword (the plan)."""
    fast, planned = AutoPositional(), AutoPositional()
    args = _mixed_args()
    fast(*args)
    planned(*args[:-1], last=args[-1])
    for got, want in zip(fast.seen['args'], planned.seen['args']):
        assert _same(got, want)
    assert _same(planned.seen['kwargs']['last'], fast.seen['args'][-1])
    assert fast.seen['autocast'] == planned.seen['autocast'] == (True, LOW)


def test_auto_fp16_fast_path_nothing_to_cast_keeps_the_arguments():
    m = AutoPositional()
    args = (torch.arange(2), torch.ones(1, dtype=LOW), ('a', [1, None]), None)
    m(*args)
    assert all(got is arg for got, arg in zip(m.seen['args'], args))
    assert m.seen['autocast'] == (True, LOW)  # still the low-precision run


def test_auto_fp16_fast_path_caller_tensors_unchanged():
    m = AutoPositional()
    x, nested = f32(3), [f32(3)]
    m(x, nested)
    assert x.dtype == F32 and nested[0].dtype == F32 and type(nested) is list
    assert m.seen['args'][1] is not nested and m.seen['args'][1][0].dtype == LOW


def test_auto_fp16_fast_path_out_fp32():
    class M(Recorder):
        @auto_fp16(out_fp32=True)
        def forward(self, x, ids, half):
            return x * 2, ids, half, [x]

    x, ids = torch.tensor([0.5, -1.5]), torch.arange(2)
    out, out_ids, out_half, out_list = M()(x, ids, torch.ones(1, dtype=OTHER))
    assert out.dtype == F32 and torch.equal(out, x * 2)
    assert out_ids is ids
    assert out_half.dtype == OTHER  # only the run's own dtype goes back to float32
    assert out_list[0].dtype == F32


@pytest.mark.parametrize('outer', [LOW, OTHER])
def test_auto_fp16_inside_an_outer_autocast(outer):
    """Nested under autocast (same dtype: run as is; another: switched, then restored)."""
    _caps.require(outer, 'native', scaled=False)
    m = AutoPositional()
    with torch.autocast('cpu', dtype=outer):
        m(f32())
        after = autocast_now()
    assert m.seen['autocast'] == (True, LOW)
    assert m.seen['args'][0].dtype == LOW
    assert after == (True, outer)
    assert autocast_now()[0] is False


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize('dtype', [BF16, 'bf16', 'bfloat16'])
def test_auto_fp16_dtype_bfloat16(dtype):
    class M(Recorder):
        @auto_fp16(dtype=dtype)
        def forward(self, x):
            self.record(x=x)
            return torch.mm(x.view(1, -1), torch.ones(2, 2))

    m = M()
    out = m(f32())
    assert m.seen['x'].dtype == BF16
    assert m.seen['autocast'] == (True, BF16)
    assert out.dtype == BF16


def test_auto_fp16_instance_fp16_dtype():
    m = AutoAll()
    m.fp16_dtype = BF16
    m(f32(), None)
    assert m.seen['x'].dtype == BF16
    assert m.seen['autocast'] == (True, BF16)


def test_auto_fp16_decorator_dtype_wins_over_instance():
    class M(Recorder):
        @auto_fp16(dtype=LOW)
        def forward(self, x):
            return self.record(x=x)

    m = M()
    m.fp16_dtype = OTHER
    m(f32())
    assert m.seen['x'].dtype == LOW and m.seen['autocast'] == (True, LOW)


@pytest.mark.parametrize('bad', [F32, 'fp32', torch.int8])
def test_auto_fp16_bad_dtype_at_decoration(bad):
    with pytest.raises(ValueError, match='low-precision dtype'):
        auto_fp16(dtype=bad)


def test_auto_fp16_inside_outer_autocast_other_dtype():
    if len(_caps.LOW_DTYPES) < 2:
        pytest.skip(f'torch.autocast runs only {_caps.LOW_DTYPES} on cpu here: no other dtype '
                    'for the outer region')
    m = AutoAll()
    with torch.autocast('cpu', dtype=BF16):
        m(f32(), None)
        assert autocast_now() == (True, BF16)  # the outer region is restored
    assert m.seen['autocast'] == (True, F16)
    assert m.seen['x'].dtype == F16


def test_auto_fp16_inside_outer_autocast_same_dtype():
    m = AutoAll()
    with torch.autocast('cpu', dtype=LOW):
        m(f32(), None)
        assert autocast_now() == (True, LOW)
    assert m.seen['autocast'] == (True, LOW)
    assert autocast_now()[0] is False


def test_auto_fp16_device_from_module_without_tensor_args():
    class M(Recorder):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        @auto_fp16()
        def forward(self, n):
            self.record(n=n)
            return self.fc(torch.ones(n, 2))

    m = M()
    out = m(3)
    assert m.seen['autocast'] == (True, LOW)
    assert out.dtype == LOW


# --------------------------------------------------------------------------- positional fast path


class AutoFour(Recorder):
    @auto_fp16()
    def forward(self, a, b, c, d):
        return self.record(a=a, b=b, c=c, d=d)


class ForceFour(Recorder):
    @force_fp32()
    def loss(self, a, b, c, d):
        return self.record(a=a, b=b, c=c, d=d)


def _same_value(a, b):
    """Equal arguments: same types, tensors equal in dtype and value, containers alike."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_value(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same_value(a[key], b[key])
    else:
        assert a == b


@pytest.mark.parametrize(('cls', 'method', 'src', 'dst'), [
    (AutoFour, 'forward', F32, LOW),
    (ForceFour, 'loss', F16, F32),
    (ForceFour, 'loss', BF16, F32),
])
@pytest.mark.parametrize('values', [
    lambda t: (t(), t(), t(), t()),
    lambda t: (None, 3, 'text', t()),
    lambda t: ([t(), torch.arange(2)], (t(),), {'k': t()}, 2.5),
    lambda t: (torch.arange(2), t().to(torch.float64), True, [t()]),
    lambda t: (nn.Parameter(t()), t(), (), {}),
])
def test_positional_call_matches_keyword_call(cls, method, src, dst, values):
    """An all-positional call (the fast path) casts exactly as a keyword call does."""
    def make():
        return (torch.arange(2, dtype=src) + 0.5).requires_grad_(False)

    m = cls()
    args = values(make)
    getattr(m, method)(*args)
    positional = m.seen
    getattr(m, method)(**dict(zip('abcd', args)))
    _same_value(positional, m.seen)
    for key, value in zip('abcd', args):
        got = positional[key]
        if isinstance(value, torch.Tensor) and value.dtype == src:
            assert got.dtype == dst
        elif not isinstance(value, (list, tuple, dict)) or not value:
            assert got is value  # untouched arguments are the very same objects
    expected = (True, LOW) if cls is AutoFour else (False, positional['autocast'][1])
    assert positional['autocast'] == expected


def test_positional_device_from_container_first():
    """With no plain tensor argument, autocast follows the first cast tensor in a container."""
    m = AutoFour()
    m(None, [f32()], 'x', 1)
    assert m.seen['b'][0].dtype == LOW and m.seen['autocast'] == (True, LOW)


def test_positional_nothing_to_cast_still_autocasts():
    m = AutoFour()
    half = torch.ones(1, dtype=LOW)
    m(half, 1, None, 'x')
    assert m.seen['a'] is half and m.seen['autocast'] == (True, LOW)


@pytest.mark.parametrize('name', ['bf16', 'bfloat16', BF16])
def test_instance_fp16_dtype_forms(name):
    m = AutoFour()
    m.fp16_dtype = name
    m(f32(), f32(), None, None)
    assert m.seen['a'].dtype == BF16 and m.seen['autocast'] == (True, BF16)


def test_class_fp16_dtype_and_autocast_flag():
    """fp16_dtype and _fp16_autocast given on the class, not the instance."""
    class M(AutoFour):
        fp16_dtype = BF16
        _fp16_autocast = False

    m = M()
    m(f32(), f32(), None, None)
    assert m.seen['a'].dtype == BF16 and m.seen['autocast'][0] is False
    m._fp16_autocast = True  # the instance attribute wins
    m(f32(), f32(), None, None)
    assert m.seen['autocast'] == (True, BF16)


def test_instance_bad_fp16_dtype_is_value_error():
    m = AutoFour()
    m.fp16_dtype = F32
    with pytest.raises(ValueError, match='low-precision dtype'):
        m(f32(), f32(), None, None)


# --------------------------------------------------------------------------- errors


class Plain:
    fp16_enabled = True

    @auto_fp16()
    def forward(self, x):
        return x


class Other:
    pass


def test_supported_types_type_error_at_call_time():
    obj = Plain()  # decorating succeeded
    with pytest.raises(TypeError, match='Module') as info:
        obj.forward(f32())
    message = str(info.value)
    assert '@auto_fp16' in message
    assert 'Plain' in message and 'Plain.forward' in message


class Base:
    pass


def test_supported_types_custom():
    class Ok(Other):
        fp16_enabled = True
        fp16_dtype = LOW

        @auto_fp16(supported_types=(Other,))
        def run(self, x):
            return x

        @force_fp32(supported_types=(Other,))
        def run32(self, x):
            return x

    class Holder:
        fp16_enabled = True

        @auto_fp16(supported_types=(Base, Other))
        def run(self, x):
            return x

        @force_fp32(supported_types=(Other,))
        def run32(self, x):
            return x

    assert Ok().run(f32()).dtype == LOW
    assert Ok().run32(torch.ones(1, dtype=F16)).dtype == F32
    with pytest.raises(TypeError) as info:
        Holder().run(f32())
    message = str(info.value)
    assert 'Base' in message and 'Other' in message and 'Holder.run' in message
    with pytest.raises(TypeError, match='@force_fp32.*Other'):
        Holder().run32(f32())


def test_call_without_arguments_is_type_error():
    @auto_fp16()
    def free():
        return 1

    with pytest.raises(TypeError, match='no arguments'):
        free()


@pytest.mark.parametrize('decorator', [auto_fp16, force_fp32])
def test_apply_to_missing_argument_at_decoration(decorator):
    with pytest.raises(ValueError) as info:
        class M(nn.Module):
            @decorator(apply_to=('x', 'gt_bboxes'))
            def loss(self, x, gt_labels):
                return x
    message = str(info.value)
    assert "'gt_bboxes'" in message
    assert 'M.loss' in message
    assert decorator.__name__ in message


@pytest.mark.parametrize('decorator', [auto_fp16, force_fp32])
def test_apply_to_var_names_are_valid(decorator):
    @decorator(apply_to=('args', 'kwargs'))
    def f(self, *args, **kwargs):
        return args, kwargs

    assert f.__name__ == 'f'


def test_apply_to_non_string_is_type_error():
    with pytest.raises(TypeError, match='argument names as strings'):
        @auto_fp16(apply_to=(0,))
        def f(self, x):
            return x


def test_signature_read_once(monkeypatch):
    calls = []
    real = inspect.signature

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(inspect, 'signature', counting)

    class M(Recorder):
        @auto_fp16(apply_to=('x',))
        def forward(self, x, y):
            return x

        @force_fp32()
        def loss(self, x):
            return x

    assert len(calls) == 2
    m = M()
    for _ in range(5):
        m.loss(m(f32(), y=f32()))
    assert len(calls) == 2


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize('decorator', [auto_fp16(), force_fp32(), auto_fp16(apply_to='x')])
def test_wraps_metadata(decorator):
    def method(self, x, y=1, *, z=2):
        """Docstring kept."""
        return x

    wrapped = decorator(method)
    assert wrapped.__name__ == 'method'
    assert wrapped.__qualname__ == method.__qualname__
    assert wrapped.__doc__ == 'Docstring kept.'
    assert wrapped.__module__ == method.__module__
    assert wrapped.__wrapped__ is method
    assert inspect.signature(wrapped) == inspect.signature(method)


# --------------------------------------------------------------------------- disabled


@pytest.mark.parametrize('enabled', [None, False, 0])
@pytest.mark.parametrize('decorator', [auto_fp16(out_fp32=True), auto_fp16(apply_to=('x',))])
def test_disabled_runs_original(enabled, decorator):
    sentinel = {'out': f32()}

    class M(Recorder):
        @decorator
        def forward(self, x, y=None):
            self.record(x=x, y=y)
            return sentinel

    m = M(enabled=enabled)
    if enabled is None:
        assert not hasattr(m, 'fp16_enabled')
    x, y = f32(), torch.ones(2, dtype=F16)
    with torch.autocast('cpu', dtype=BF16):
        out = m(x, y=y)
    assert m.seen['x'] is x and m.seen['y'] is y
    assert m.seen['autocast'] == (True, BF16)  # autocast left as the caller set it
    assert out is sentinel and out['out'].dtype == F32
    m(x)
    assert m.seen['autocast'][0] is False  # and no autocast of its own


@pytest.mark.parametrize('enabled', [None, False, 0])
def test_force_fp32_without_flag_runs_original_outside_autocast(enabled):
    sentinel = {'out': f32()}

    class M(Recorder):
        @force_fp32(out_fp16=True)
        def loss(self, x, y=None):
            self.record(x=x, y=y)
            return sentinel

    m = M(enabled=enabled)
    x, y = torch.ones(2, dtype=F16), torch.ones(2, dtype=BF16)
    out = m.loss(x, y=y)
    assert m.seen['x'] is x and m.seen['y'] is y  # untouched, as mmcv's
    assert m.seen['autocast'] == (False, autocast_now()[1])
    assert out is sentinel and out['out'].dtype == F32


@pytest.mark.parametrize('enabled', [None, False, 0])
@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES, ids=lambda d: _caps.NAMES[d])
def test_force_fp32_without_flag_acts_under_autocast(enabled, dtype):
    """The 1.x style: the flags are gone, the whole forward autocasts; the loss is float32."""

    class M(Recorder):
        @force_fp32(apply_to=('pred',))
        def loss(self, pred, target):
            self.record(pred=pred, target=target)
            return torch.mm(pred, pred.t()).sum()

    m = M(enabled=enabled)
    pred = torch.tensor([[0.5, -1.25], [3.0, 2.0]], dtype=dtype)
    target = torch.ones(2, dtype=dtype)
    with torch.autocast('cpu', dtype=dtype):
        out = m.loss(pred, target)
        assert autocast_now() == (True, dtype)  # restored for the caller
    assert m.seen['pred'].dtype == F32 and torch.equal(m.seen['pred'], pred.float())
    assert m.seen['target'] is target  # not named in apply_to
    assert m.seen['autocast'][0] is False  # the body runs with autocast off
    assert out.dtype == F32


@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES, ids=lambda d: _caps.NAMES[d])
def test_force_fp32_without_flag_out_fp16_gives_the_autocast_dtype(dtype):
    class M(nn.Module):
        @force_fp32(out_fp16=True)
        def loss(self, pred):
            return pred * 2, torch.arange(2)

    with torch.autocast('cpu', dtype=dtype):
        out, ids = M().loss(torch.ones(2, dtype=dtype))
    assert out.dtype == dtype and ids.dtype == torch.int64


def test_force_fp32_without_flag_autocast_disabled_region_runs_original():
    class M(Recorder):
        @force_fp32()
        def loss(self, x):
            return self.record(x=x)

    m = M(enabled=None)
    x = torch.ones(2, dtype=BF16)
    with torch.autocast('cpu', dtype=BF16), torch.autocast('cpu', enabled=False):
        m.loss(x)
    assert m.seen['x'] is x


def test_class_attribute_enables():
    class M(nn.Module):
        fp16_enabled = True
        fp16_dtype = LOW

        def __init__(self):
            super().__init__()
            self.seen = None

        @auto_fp16()
        def forward(self, x):
            self.seen = x.dtype
            return x

    m = M()
    m(f32())
    assert m.seen == LOW
    m.fp16_enabled = False  # instance attribute overrides the class one
    m(f32())
    assert m.seen == F32


def test_property_flag():
    class M(nn.Module):
        fp16_dtype = LOW

        def __init__(self):
            super().__init__()
            self.flag = False

        @property
        def fp16_enabled(self):
            return self.flag

        @auto_fp16()
        def forward(self, x):
            return x

    m = M()
    assert m(f32()).dtype == F32
    m.flag = True
    assert m(f32()).dtype == LOW


# --------------------------------------------------------------------------- force_fp32


class Force(Recorder):
    @force_fp32()
    def loss(self, a, b, c=None, *, d=None):
        return self.record(a=a, b=b, c=c, d=d)


def test_force_fp32_casts_half_and_bfloat16():
    m = Force()
    ids, full = torch.arange(2), f32()
    m.loss(torch.ones(2, dtype=F16), [torch.ones(2, dtype=BF16)], ids, d=full)
    seen = m.seen
    assert seen['a'].dtype == F32 and seen['b'][0].dtype == F32
    assert seen['c'] is ids and seen['d'] is full
    assert seen['autocast'][0] is False


def test_force_fp32_values_preserved():
    m = Force()
    h = torch.tensor([0.5, -1.25, 3.0], dtype=F16)
    m.loss(h, None)
    assert torch.equal(m.seen['a'], h.float())


def test_force_fp32_disables_outer_autocast():
    m = Force()
    with torch.autocast('cpu', dtype=BF16):
        m.loss(torch.ones(2, dtype=BF16), torch.ones(2, dtype=F16))
        assert autocast_now() == (True, BF16)  # restored for the caller
    assert m.seen['autocast'][0] is False
    assert m.seen['a'].dtype == F32 and m.seen['b'].dtype == F32


def test_force_fp32_matmul_is_float32_inside_autocast():
    class M(Recorder):
        @force_fp32()
        def loss(self, x):
            return torch.mm(x, x)

    with torch.autocast('cpu', dtype=BF16):
        out = M().loss(torch.ones(2, 2, dtype=BF16))
    assert out.dtype == F32


def test_force_fp32_apply_to():
    class M(Recorder):
        @force_fp32(apply_to=('pred',))
        def loss(self, pred, target):
            return self.record(pred=pred, target=target)

    m = M()
    target = torch.ones(2, dtype=F16)
    m.loss(torch.ones(2, dtype=F16), target)
    assert m.seen['pred'].dtype == F32 and m.seen['target'] is target
    m.loss(target=target, pred=torch.ones(2, dtype=BF16))
    assert m.seen['pred'].dtype == F32 and m.seen['target'] is target


def test_force_fp32_out_fp16():
    class M(Recorder):
        @force_fp32(out_fp16=True)
        def loss(self, x):
            return x * 2, torch.arange(2)

    m = M()
    out, ids = m.loss(torch.ones(2, dtype=F16))
    assert out.dtype == LOW and torch.equal(out, torch.full((2,), 2.0, dtype=LOW))
    assert ids.dtype == torch.int64
    m.fp16_dtype = BF16
    out, _ = m.loss(torch.ones(2, dtype=BF16))
    assert out.dtype == BF16


def test_auto_fp16_then_force_fp32_nesting():
    class M(Recorder):
        @auto_fp16(out_fp32=True)
        def forward(self, x):
            inner = autocast_now()
            y = self.loss(x * 2)
            return y, inner, autocast_now()

        @force_fp32()
        def loss(self, y):
            self.record(y=y)
            return y.sum()

    m = M()
    out, inner, after = m(f32())
    assert inner == (True, LOW) and after == (True, LOW)
    assert m.seen['y'].dtype == F32 and m.seen['autocast'][0] is False
    assert out.dtype == F32
    assert autocast_now()[0] is False


# --------------------------------------------------------------------------- legacy


def test_legacy_backend_casts_without_autocast():
    class M(Recorder):
        def __init__(self):
            super().__init__(enabled=False)
            self.fc = nn.Linear(2, 2)

        @auto_fp16()
        def forward(self, x):
            self.record(x=x)
            return self.fc(x)

    m = wrap_fp16_model(M(), dtype=LEGACY, backend='legacy')
    assert m._fp16_autocast is False
    out = m(f32())
    assert m.seen['x'].dtype == LEGACY
    assert m.seen['autocast'][0] is False
    assert out.dtype == LEGACY  # the half Linear ran on half input


def test_legacy_env_backend_without_autocast(force_backend):
    force_backend('legacy')
    m = AutoAll()
    m(f32(), None)
    assert m.seen['x'].dtype == LOW and m.seen['autocast'][0] is False


def test_old_torch_casts_without_autocast(old_torch):
    m = AutoAll()
    m(f32(), None)
    assert m.seen['x'].dtype == LOW and m.seen['autocast'][0] is False
    f = Force()
    with torch.autocast('cpu', dtype=BF16):
        f.loss(torch.ones(1, dtype=F16), torch.ones(1, dtype=BF16))
    assert f.seen['a'].dtype == F32 and f.seen['b'].dtype == F32


# --------------------------------------------------------------------------- exceptions


class Boom(Recorder):
    @auto_fp16()
    def forward(self, x):
        raise KeyError('boom in forward')

    @force_fp32()
    def loss(self, x):
        raise KeyError('boom in loss')


def test_autocast_restored_after_auto_fp16_raises():
    with pytest.raises(KeyError, match='boom in forward'):
        Boom()(f32())
    assert autocast_now()[0] is False
    with torch.autocast('cpu', dtype=BF16):
        with pytest.raises(KeyError, match='boom in forward'):
            Boom()(f32())
        assert autocast_now() == (True, BF16)
    # Later regions work normally.
    m = AutoAll()
    m(f32(), None)
    assert m.seen['autocast'] == (True, LOW)


def test_autocast_restored_after_force_fp32_raises():
    with torch.autocast('cpu', dtype=BF16):
        with pytest.raises(KeyError, match='boom in loss'):
            Boom().loss(torch.ones(1, dtype=F16))
        assert autocast_now() == (True, BF16)
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == BF16
    assert autocast_now()[0] is False


# --------------------------------------------------------------------------- real model


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.fp16_enabled = False
        self.inner_dtype = None

    @auto_fp16(apply_to=('x',), out_fp32=True)
    def forward(self, x):
        h = torch.relu(self.fc1(x))
        self.inner_dtype = h.dtype
        return self.head(self.fc2(h))

    @force_fp32(apply_to=('y',))
    def head(self, y):
        return torch.log_softmax(y, dim=-1)


@pytest.mark.parametrize(('dtype', 'tol'), [(d, t) for d, t in [(F16, 1e-2), (BF16, 5e-2)]
                                            if d in _caps.LOW_DTYPES])
def test_real_module_matches_float32(dtype, tol):
    torch.manual_seed(0)
    ref = Net()
    amp = wrap_fp16_model(copy.deepcopy(ref), dtype=dtype, backend='native')
    x = torch.randn(5, 8)
    expected = ref(x)
    got = amp(x)
    assert ref.inner_dtype == F32
    assert amp.inner_dtype == dtype
    assert got.dtype == F32
    assert torch.allclose(got, expected, atol=tol, rtol=tol)
    assert not torch.equal(got, expected)  # it really ran in low precision

    got.sum().backward()
    assert amp.fc1.weight.dtype == F32  # native: the parameters stay float32
    assert amp.fc1.weight.grad.dtype == F32
    expected.sum().backward()
    assert torch.allclose(amp.fc2.weight.grad, ref.fc2.weight.grad, atol=5 * tol, rtol=5 * tol)


# ------------------------------------------------------------- devices without autocast


class _MetaHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fp16_enabled = True

    @auto_fp16(apply_to=('x',))
    def forward(self, x, *, y=None):
        return x if y is None else (x, y)

    @auto_fp16(out_fp32=True)
    def out32(self, x):
        return x * 2

    @force_fp32(apply_to=('pred',))
    def loss(self, pred):
        return pred

    @force_fp32(out_fp16=True)
    def back16(self, pred):
        return pred + 1


@pytest.mark.parametrize('outer', [False, True], ids=['plain', 'under-cpu-autocast'])
@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES)
def test_decorators_cast_meta_tensors_by_dtype_where_the_device_has_no_autocast(outer, dtype):
    head = _MetaHead()
    head.fp16_dtype = dtype
    x = torch.empty(2, 3, device='meta')
    ctx = torch.autocast('cpu', dtype=torch.bfloat16) if outer else contextlib.nullcontext()
    before = _caps.autocast_now('cpu')
    with ctx:
        y = head(x)
        pair = head(x, y=torch.empty(1, device='meta'))
        assert (y.device.type, y.dtype, y.shape) == ('meta', dtype, (2, 3))
        assert pair[0].dtype == dtype and pair[1].dtype == torch.float32  # y not in apply_to
        assert head.out32(x).dtype == torch.float32
        assert (head.loss(y).device.type, head.loss(y).dtype) == ('meta', torch.float32)
        assert head.back16(y).dtype == dtype
    assert _caps.autocast_now('cpu') == before  # nothing left switched on


def test_autocast_available_says_meta_has_no_autocast():
    from fp16utils._torch.autocast import autocast_available, autocast_for, autocast_state

    assert autocast_available('cpu') and not autocast_available('meta')
    assert autocast_state('meta') == (False, None)
    before = autocast_state('cpu')
    with autocast_for('meta', torch.float16):  # a context that changes nothing
        assert autocast_state('cpu') == before


# ------------------------------------------------- settings read when the flag is set by hand


class ByHand(nn.Module):
    """A module whose flag is set by hand (no wrap_fp16_model): the class decides the rest."""

    @auto_fp16()
    def forward(self, x):
        return x, autocast_now()


def _by_hand(**attrs):
    m = ByHand()
    m.fp16_enabled = True
    for name, value in attrs.items():
        setattr(m, name, value)
    return m


def test_by_hand_flag_follows_instance_attributes_set_after_the_first_call():
    m = _by_hand()
    assert m(f32())[0].dtype == F16  # the class says nothing: float16
    m.fp16_dtype = BF16
    assert m(f32())[1] == (True, BF16)
    m._fp16_autocast = False
    out, state = m(f32())
    assert out.dtype == BF16 and state[0] is False
    m._fp16_autocast = None  # None on the instance: the default backend again
    assert m(f32())[1] == (True, BF16)
    del m.fp16_dtype
    assert m(f32())[0].dtype == F16


def test_by_hand_flag_follows_the_default_backend_after_refresh(force_backend):
    m = _by_hand(fp16_dtype=BF16)
    assert m(f32())[1] == (True, BF16)
    force_backend('legacy')
    out, state = m(f32())
    assert out.dtype == BF16 and state[0] is False
    force_backend('native')
    assert m(f32())[1] == (True, BF16)


def test_by_hand_flag_reads_each_class_and_its_properties():
    class Bf16(ByHand):
        fp16_dtype = BF16

    class Legacy(ByHand):
        _fp16_autocast = False

    class Chosen(ByHand):
        choice = BF16

        @property
        def fp16_dtype(self):
            return self.choice

    a, b, c = ByHand(), Bf16(), Legacy()
    for m in (a, b, c):
        m.fp16_enabled = True
    # One decorated function, three classes: each class's own settings.
    assert [m(f32())[0].dtype for m in (a, b, c, a, b)] == [F16, BF16, F16, F16, BF16]
    assert c(f32())[1][0] is False and b(f32())[1] == (True, BF16)
    d = Chosen()
    d.fp16_enabled = True
    assert d(f32())[0].dtype == BF16
    d.choice = 'float16'  # a property is read on every call, names resolved
    assert d(f32())[0].dtype == F16


def test_flag_as_mmcv_reads_it_class_instance_property_or_missing():
    class NoFlag(nn.Module):
        @auto_fp16()
        def forward(self, x):
            return x

    class ClassFlag(NoFlag):
        fp16_enabled = True

    x = f32()
    assert NoFlag()(x) is x
    assert ClassFlag()(x).dtype == F16
    off = ClassFlag()
    off.fp16_enabled = False  # the instance wins
    assert off(x) is x


def test_private_helpers_that_keep_fp32_shares():
    from fp16utils.decorators import fp32_plan, run_fp32, undecorated

    def f(self, x, y=None):
        return x, y, autocast_now()

    plan = fp32_plan(f)
    assert plan.all_args
    with torch.autocast('cpu', dtype=BF16):
        x, y, state = run_fp32(plan, f, (None, torch.ones(1, dtype=BF16)),
                               {'y': torch.ones(1, dtype=F16)})
    assert (x.dtype, y.dtype, state[0]) == (F32, F32, False)
    assert undecorated(auto_fp16()(force_fp32()(f))) is f
    other = contextlib.contextmanager(f)  # another decorator stays
    assert undecorated(auto_fp16()(other)) is other


def test_cast_plan_casts_only_the_named_arguments():
    from fp16utils._cast_plan import CastPlan

    plan = CastPlan(lambda self, x, y, *rest, k=None: x, ('x', 'rest', 'k'), 'auto_fp16')
    one = torch.ones(1)
    args, kwargs = plan.cast((None, one, one, one), {'k': one}, (F32,), F16, [])
    assert [a.dtype for a in args[1:]] == [F16, F32, F16] and kwargs['k'].dtype == F16
