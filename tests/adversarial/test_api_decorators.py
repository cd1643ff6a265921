"""Adversarial use of ``auto_fp16`` and ``force_fp32``: bad arguments, odd functions,
odd owners, copies, threads and re-entrancy.
"""

from __future__ import annotations

import copy
import pickle
import threading

import _caps  # tests/ is on sys.path: see tests/conftest.py
import pytest
import torch
from torch import nn

from fp16utils import auto_fp16, force_fp32

F32 = torch.float32
LOW = _caps.LOW
DECORATORS = [auto_fp16, force_fp32]


def method(self, x):
    return x


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize('deco', DECORATORS)
def test_apply_to_a_single_string_names_one_argument(deco):
    class Net(nn.Module):
        fp16_enabled = True
        fp16_dtype = LOW

        @deco(apply_to='x')
        def forward(self, x, xy):
            return x, xy

    src = F32 if deco is auto_fp16 else LOW
    x, xy = Net()(torch.ones(1, dtype=src), torch.ones(1, dtype=src))
    assert x.dtype != src and xy.dtype == src  # 'x' is not matched inside 'xy'


@pytest.mark.parametrize('deco', DECORATORS)
@pytest.mark.parametrize(('apply_to', 'match'), [
    (5, 'takes a list or tuple of argument names'),
    ([1], 'takes argument names as strings; got 1'),
    (('x', None), 'takes argument names as strings; got None'),
    (['nope'], "has no argument 'nope'"),
])
def test_bad_apply_to_is_refused_when_the_decorator_is_applied(deco, apply_to, match):
    with pytest.raises((TypeError, ValueError), match=match):
        deco(apply_to=apply_to)(method)


@pytest.mark.parametrize('deco', DECORATORS)
def test_decorator_without_parentheses_is_a_clear_error(deco):
    with pytest.raises(TypeError, match=r'without parentheses.*write @\w+\(\)'):
        deco(method)


@pytest.mark.parametrize(('deco', 'flag'), [(auto_fp16, 'out_fp32'), (force_fp32, 'out_fp16')])
@pytest.mark.parametrize('value', ['no', 'False', 1.0, [True]])
def test_output_flag_that_is_not_a_bool_is_refused(deco, flag, value):
    with pytest.raises(TypeError, match=f'{flag}=...\\) takes True or False'):
        deco(**{flag: value})


@pytest.mark.parametrize('deco', DECORATORS)
@pytest.mark.parametrize('types', [5, (nn.Module, 'Linear'), (), None])
def test_supported_types_that_are_not_classes_are_refused(deco, types):
    with pytest.raises(TypeError, match='supported_types=...\\) takes a class'):
        deco(supported_types=types)


def test_supported_types_may_be_a_single_class():
    class Owner:
        fp16_enabled = True

        @force_fp32(supported_types=object)
        def loss(self, x):
            return x

    assert Owner().loss(torch.ones(1, dtype=LOW)).dtype == F32


@pytest.mark.parametrize('dtype', ['int8', torch.float64, 'bogus', torch.int32])
def test_auto_fp16_dtype_outside_float16_and_bfloat16_is_refused(dtype):
    with pytest.raises(ValueError, match='Unsupported low-precision dtype'):
        auto_fp16(dtype=dtype)


# --------------------------------------------------------------------------- what is decorated


@pytest.mark.parametrize('deco', DECORATORS)
@pytest.mark.parametrize('wrapper', [staticmethod, classmethod, property])
def test_staticmethod_classmethod_and_property_objects_are_refused(deco, wrapper):
    with pytest.raises(TypeError, match=f'not a {wrapper.__name__} object'):
        deco()(wrapper(method))


async def _coroutine(self, x):
    return x


def _generator(self, x):
    yield x


async def _async_generator(self, x):
    yield x


@pytest.mark.parametrize('deco', DECORATORS)
@pytest.mark.parametrize('func', [_coroutine, _generator, _async_generator])
def test_generator_and_async_functions_are_refused(deco, func):
    with pytest.raises(TypeError, match='generator or async function'):
        deco()(func)


@pytest.mark.parametrize('deco', DECORATORS)
def test_non_callable_is_refused(deco):
    with pytest.raises(TypeError, match='inspectable signature'):
        deco()(5)


def test_decorated_method_called_without_arguments_names_that():
    fn = auto_fp16()(method)
    with pytest.raises(TypeError, match='was called with no arguments'):
        fn()


class Head(nn.Module):
    def __init__(self, enabled=True):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.fp16_enabled = enabled
        self.fp16_dtype = LOW

    @auto_fp16(out_fp32=True)
    def forward(self, x):
        return {'y': self.fc(x), 'n': 3, 's': 'text', 'none': None, 'i': torch.arange(2)}

    @force_fp32(out_fp16=True)
    def loss(self, pred):
        return pred.sum(), 'tag'

    @auto_fp16()
    def probe(self, x):
        return x.dtype, _caps.autocast_now()


def test_out_fp32_passes_non_tensor_outputs_through():
    out = Head()(torch.ones(1, 2))
    assert out['y'].dtype == F32 and out['i'].dtype == torch.int64
    assert (out['n'], out['s'], out['none']) == (3, 'text', None)


def test_out_fp16_passes_non_tensor_outputs_through():
    total, tag = Head().loss(torch.ones(2, dtype=LOW))
    assert total.dtype == LOW and tag == 'tag'


@pytest.mark.parametrize('flag', [1, 'yes', torch.tensor(True), [0]])
def test_truthy_non_bool_fp16_enabled_switches_on_as_in_mmcv(flag):
    assert Head(enabled=flag).probe(torch.ones(1)) == (LOW, (True, LOW))


@pytest.mark.parametrize('flag', [0, '', None, torch.tensor(False)])
def test_falsy_non_bool_fp16_enabled_runs_the_method_untouched(flag):
    assert Head(enabled=flag).probe(torch.ones(1)) == (F32, _caps.autocast_now())


def test_fp16_enabled_without_a_truth_value_is_a_clear_error():
    head = Head(enabled=torch.tensor([True, False]))
    with pytest.raises(TypeError, match='Head.fp16_enabled must be True or False'):
        head(torch.ones(1, 2))


def test_bad_fp16_dtype_attribute_names_the_attribute():
    class Net(nn.Module):
        fp16_enabled = True
        fp16_dtype = 'int8'

        @force_fp32(out_fp16=True)
        def loss(self, x):
            return x

    with pytest.raises(ValueError, match=r"Net.fp16_dtype: Unsupported .*'int8'"):
        Net().loss(torch.ones(1))


def test_first_argument_of_a_subclass_of_supported_types_that_is_not_a_module():
    class Base:
        pass

    class Owner(Base):
        fp16_enabled = True

        @auto_fp16(supported_types=(Base,), dtype=LOW)
        def run(self, x):
            return x

    assert Owner().run(torch.ones(1)).dtype == LOW  # no module: cpu autocast
    with pytest.raises(TypeError, match=r'methods of Base; .*Owner.run was called with int'):
        Owner.run(3, torch.ones(1))


# --------------------------------------------------------------------------- copies


class Picklable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fp16_enabled = True
        self.fp16_dtype = LOW

    @auto_fp16(apply_to=('x',))
    def forward(self, x, y):
        return x, y


def test_decorated_functions_and_their_modules_pickle_and_deepcopy():
    assert pickle.loads(pickle.dumps(Picklable.forward)) is Picklable.forward
    assert copy.deepcopy(Picklable.forward) is Picklable.forward
    for net in (copy.deepcopy(Picklable()), pickle.loads(pickle.dumps(Picklable()))):
        x, y = net(torch.ones(1), torch.ones(1))
        assert (x.dtype, y.dtype) == (LOW, F32)


# --------------------------------------------------------------------------- re-entrancy


class Inner(nn.Module):
    fp16_enabled = True

    @force_fp32()
    def loss(self, x):
        return x, _caps.autocast_now()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.inner = Inner()
        self.fp16_enabled = True
        self.fp16_dtype = LOW

    @auto_fp16()
    def forward(self, x, fail=False):
        state = _caps.autocast_now()
        y = self.fc(x)
        z, inner_state = self.inner.loss(y)
        if fail:
            raise KeyError('inside')
        return y, z, state, inner_state, self.twice(x)

    @auto_fp16()
    def twice(self, x):
        return _caps.autocast_now()


def test_nested_decorated_calls_see_their_own_autocast_state_and_restore_it():
    before = _caps.autocast_now()
    y, z, state, inner_state, again = Outer()(torch.ones(1, 2))
    assert (y.dtype, z.dtype) == (LOW, F32)
    assert state == (True, LOW) and again == (True, LOW)
    assert inner_state[0] is False
    assert _caps.autocast_now() == before


def test_exception_inside_restores_autocast_and_propagates_unchanged():
    before = _caps.autocast_now()
    with pytest.raises(KeyError, match='inside'):
        Outer()(torch.ones(1, 2), fail=True)
    assert _caps.autocast_now() == before
    with torch.autocast('cpu', dtype=LOW):
        with pytest.raises(KeyError):
            Outer()(torch.ones(1, 2), fail=True)
        assert _caps.autocast_now() == (True, LOW)


# --------------------------------------------------------------------------- threads


def _run_threads(work, n=4):
    errors = []

    def guarded(i):
        try:
            work(i)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(repr(err))

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_one_module_from_several_threads_with_autocast_on_and_off():
    net = Outer()
    x = torch.ones(1, 2)
    expected = net(x)[0]

    def work(i):
        for _ in range(30):
            if i % 2:
                with torch.autocast('cpu', enabled=False):
                    y, z = net(x)[:2]
                assert _caps.autocast_now()[0] is False
            else:
                y, z = net(x)[:2]
            assert (y.dtype, z.dtype) == (LOW, F32)
            assert torch.equal(y, expected)
        assert _caps.autocast_now()[0] is False

    assert _run_threads(work) == []


def test_wrap_sets_the_flag_only_after_the_dtype_and_backend():
    from fp16utils import wrap_fp16_model

    class Recording(nn.Module):
        fp16_enabled = False

        def __setattr__(self, name, value):
            if name == 'fp16_enabled' and value:
                seen.append((self.__dict__.get('fp16_dtype'),
                             self.__dict__.get('_fp16_autocast')))
            super().__setattr__(name, value)

    seen = []
    wrap_fp16_model(nn.Sequential(Recording(), Recording()), dtype=LOW, backend='native')
    assert seen == [(LOW, True), (LOW, True)]


def test_wrapping_in_one_thread_while_another_calls_the_module():
    from fp16utils import wrap_fp16_model

    dtype = _caps.LOW_DTYPES[-1]
    nets = [Outer() for _ in range(40)]
    for net in nets:
        for m in net.modules():
            if hasattr(m, 'fp16_enabled'):
                m.fp16_enabled = False
                m.__dict__.pop('fp16_dtype', None)
    seen = []
    stop = threading.Event()

    def work(i):
        if i == 0:
            for net in nets:
                wrap_fp16_model(net, dtype=dtype, backend='native')
            stop.set()
        else:
            while not stop.is_set():
                for net in nets:
                    seen.append(net(torch.ones(1, 2))[0].dtype)

    assert _run_threads(work, n=2) == []
    assert set(seen) <= {F32, dtype}  # never the default float16 of a half-wrapped module
