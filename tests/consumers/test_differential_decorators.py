"""Differential: ``auto_fp16`` / ``force_fp32`` against mmcv 1.7.2's own, on this CPU.

The same method body is decorated by mmcv's decorator and by fp16utils', with every
``apply_to`` form, ``out_fp32`` / ``out_fp16``, with the flag absent, False and True,
and called in every way its signature allows; outputs (types, dtypes, values) are
compared. The bodies are what autocast leaves alone (the arguments themselves,
elementwise arithmetic): on a machine without CUDA mmcv's ``torch.cuda.amp.autocast``
is disabled (with a warning) and its decorators only cast the arguments, while
fp16utils autocasts on the CPU; that difference has its own test below, with the
others docs/reference/differences-mmcv.md lists.
"""

from __future__ import annotations

import itertools
import warnings

import _consumers
import pytest

_consumers.require()

import torch  # noqa: E402
from _mmcv_ref import call, compares, fp16_utils, shapes  # noqa: E402
from _same import difference  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import fp16utils  # noqa: E402

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

APPLY_TO = [None, ('x',), ('y',), ('x', 'y'), ('z',), ('x', 'y', 'z'), ['y', 'z'], ()]
OUT = [False, True]
FLAGS = ['absent', False, True, 'class attribute True']


def _call_forms(x, y, z):
    """(label, args, kwargs): every way to call ``forward(self, x, y=None, z=None)``."""
    return [
        ('x', (x,), {}),
        ('x, y', (x, y), {}),
        ('x, y, z', (x, y, z), {}),
        ('x, y=', (x,), {'y': y}),
        ('x, z=', (x,), {'z': z}),
        ('x=, y=, z=', (), {'x': x, 'y': y, 'z': z}),
        ('x, y, z=', (x, y), {'z': z}),
    ]


CALLS = [label for label, _, _ in _call_forms(0, 0, 0)]


def _body(self, x, y=None, z=None):
    """Autocast-neutral: the arguments, and an elementwise result of x."""
    doubled = x * 2 if isinstance(x, torch.Tensor) else None
    return x, y, z, doubled


def decorated(lib, name, apply_to, out, flag):
    """An instance of a module whose ``forward`` is ``_body`` under ``lib``'s decorator."""
    out_name = 'out_fp32' if name == 'auto_fp16' else 'out_fp16'
    decorator = getattr(lib, name)(apply_to=apply_to, **{out_name: out})

    def forward(self, x, y=None, z=None):
        return _body(self, x, y, z)

    attrs = {'forward': decorator(forward)}
    if flag == 'class attribute True':
        attrs['fp16_enabled'] = True
    module = type('Net', (nn.Module,), attrs)()
    if flag in (False, True):
        module.fp16_enabled = flag
    return module


def compare(name, apply_to, out, flag, args, kwargs):
    expected = call(lambda: decorated(fp16_utils(), name, apply_to, out, flag)(*args, **kwargs))
    got = call(lambda: decorated(fp16utils, name, apply_to, out, flag)(*args, **kwargs))
    assert expected[0] == got[0], f'mmcv: {expected}; fp16utils: {got}'
    if expected[0] == 'ok':
        found = difference(expected[1], got[1])
        assert found is None, found


def _values(name):
    """Fixed arguments holding every dtype the decorator looks at (and others)."""
    if name == 'auto_fp16':
        return (torch.tensor([1.5, -2.0]),
                [torch.ones(2), torch.ones(1, dtype=F16), torch.arange(2), 'y'],
                {'a': torch.full((2,), 3.0), 'b': torch.ones(1, dtype=BF16), 'c': None})
    return (torch.tensor([1.5, -2.0], dtype=F16),
            [torch.ones(2, dtype=F16), torch.ones(1), torch.arange(2), 'y'],
            {'a': torch.full((2,), 3.0, dtype=F16), 'b': torch.ones(1), 'c': None})


def _cases(name, flags):
    return list(itertools.product(APPLY_TO, OUT, flags, CALLS))


for _name in ('auto_fp16', 'force_fp32'):
    shapes(_name, [f'apply_to={a}, out={o}, flag={f}, call({c})'
                   for a, o, f, c in _cases(_name, FLAGS)])
    shapes(_name, ['first argument not a module'])


@pytest.mark.parametrize('flag', [True, 'class attribute True'])
@pytest.mark.parametrize('name', ['auto_fp16', 'force_fp32'])
def test_every_form_and_call_with_the_flag_on_matches_mmcv(name, flag):
    forms = {label: (args, kwargs) for label, args, kwargs in _call_forms(*_values(name))}
    for apply_to, out, _, label in _cases(name, [flag]):
        args, kwargs = forms[label]
        try:
            compare(name, apply_to, out, flag, args, kwargs)
        except AssertionError as err:
            raise AssertionError(f'apply_to={apply_to}, out={out}, call({label}): {err}') from None


def test_auto_fp16_without_the_flag_runs_untouched_as_in_mmcv():
    forms = {label: (args, kwargs) for label, args, kwargs in _call_forms(*_values('auto_fp16'))}
    for apply_to, out, flag, label in _cases('auto_fp16', ['absent', False]):
        compare('auto_fp16', apply_to, out, flag, *forms[label])


def test_force_fp32_without_the_flag_runs_untouched_as_in_mmcv():
    """Outside autocast: the case where fp16utils' force_fp32 acts as mmcv's does."""
    forms = {label: (args, kwargs) for label, args, kwargs in _call_forms(*_values('force_fp32'))}
    assert not torch.is_autocast_enabled('cpu')
    for apply_to, out, flag, label in _cases('force_fp32', ['absent', False]):
        compare('force_fp32', apply_to, out, flag, *forms[label])


@pytest.mark.parametrize('name', ['auto_fp16', 'force_fp32'])
def test_first_argument_not_a_module_is_a_type_error_in_both(name):
    for lib in (fp16_utils(), fp16utils):
        class Plain:
            forward = getattr(lib, name)()(_body)

        status, err = call(Plain().forward, torch.ones(1))
        assert status == 'raises' and isinstance(err, TypeError)


# -- random arguments ------------------------------------------------------------------

_TENSORS = st.sampled_from([F32, F16, torch.int64]).flatmap(
    lambda dtype: st.lists(st.floats(-1e3, 1e3, width=16), min_size=1, max_size=3).map(
        lambda values: torch.tensor(values, dtype=dtype)))
_ARGS = st.recursive(st.one_of(_TENSORS, st.sampled_from([None, 'text', 3])),
                     lambda children: st.one_of(st.lists(children, max_size=3),
                                                st.dictionaries(st.sampled_from('abc'), children,
                                                                max_size=3)),
                     max_leaves=6)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(['auto_fp16', 'force_fp32']), st.sampled_from(APPLY_TO),
       st.sampled_from(OUT), st.sampled_from([True, 'class attribute True', 'absent']),
       st.sampled_from(range(len(CALLS))), _ARGS, _ARGS, _ARGS)
def test_random_arguments_match_mmcv(name, apply_to, out, flag, form, x, y, z):
    _, args, kwargs = _call_forms(x, y, z)[form]
    compare(name, apply_to, out, flag, args, kwargs)


# -- the differences docs/reference/differences-mmcv.md lists -----------------------------


def _on(lib, name, func, **kwargs):
    module = type('Net', (nn.Module,), {'forward': getattr(lib, name)(**kwargs)(func)})()
    module.fp16_enabled = True
    return module


def _dtypes(obj):
    if isinstance(obj, torch.Tensor):
        return obj.dtype
    if isinstance(obj, (list, tuple)):
        return tuple(_dtypes(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _dtypes(v) for k, v in obj.items()}
    return obj


@compares('auto_fp16', ['difference: autocast on the cpu'])
def test_difference_the_body_runs_under_autocast_on_the_cpu():
    def forward(self, x):
        return x, self.weight @ self.weight

    def make(lib):
        module = _on(lib, 'auto_fp16', forward)
        module.weight = nn.Parameter(torch.eye(2))
        return module

    x = torch.ones(2)
    assert _dtypes(call(make(fp16_utils()), x)[1]) == (F16, F32)  # cast, no autocast
    assert _dtypes(call(make(fp16utils), x)[1]) == (F16, F16)  # cast, then autocast

    def linear(self, x):
        return self.layer(x)

    def make_linear(lib):
        module = _on(lib, 'auto_fp16', linear)
        module.layer = nn.Linear(2, 2)
        return module

    status, err = call(make_linear(fp16_utils()), torch.ones(1, 2))
    assert status == 'raises' and 'dtype' in str(err)  # a half input to a float32 layer
    assert call(make_linear(fp16utils), torch.ones(1, 2))[1].dtype == F16

    # mmcv's decorators warn on each call: torch.cuda.amp is deprecated (and, without
    # CUDA, disabled). fp16utils' warn about nothing.
    theirs = {FutureWarning} | (set() if torch.cuda.is_available() else {UserWarning})
    for lib, expected in ((fp16_utils(), theirs), (fp16utils, set())):
        module = make(lib)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            module(x)
        assert {w.category for w in caught} == expected, [str(w.message) for w in caught]


@compares('force_fp32', ['difference: *args, apply_to=None'])
@compares('auto_fp16', ['difference: *args, apply_to=None', 'difference: *args named'])
def test_difference_arguments_of_star_args_are_kept_and_cast():
    def forward(self, x, *rest):
        return x, rest

    args = (torch.ones(1), torch.ones(1), torch.ones(1))
    assert _dtypes(call(_on(fp16_utils(), 'auto_fp16', forward), *args)[1]) == (F16, ())
    assert _dtypes(call(_on(fp16utils, 'auto_fp16', forward), *args)[1]) == (F16, (F16, F16))
    named = dict(apply_to=('rest',))
    assert _dtypes(call(_on(fp16_utils(), 'auto_fp16', forward, **named), *args)[1]) == (F32, ())
    assert _dtypes(call(_on(fp16utils, 'auto_fp16', forward, **named), *args)[1]) == (
        F32, (F16, F16))
    half = tuple(a.half() for a in args)
    assert _dtypes(call(_on(fp16_utils(), 'force_fp32', forward), *half)[1]) == (F32, ())
    assert _dtypes(call(_on(fp16utils, 'force_fp32', forward), *half)[1]) == (F32, (F32, F32))


@compares('force_fp32', ['difference: keyword-only, apply_to=None'])
@compares('auto_fp16', ['difference: keyword-only, apply_to=None', 'difference: **kwargs named'])
def test_difference_keyword_only_and_extra_keyword_arguments_are_cast_when_apply_to_is_none():
    def forward(self, x, *, k, **extra):
        return x, k, extra

    kwargs = dict(k=torch.ones(1), e=torch.ones(1))
    assert _dtypes(call(_on(fp16_utils(), 'auto_fp16', forward), torch.ones(1), **kwargs)[1]
                   ) == (F16, F32, {'e': F32})
    assert _dtypes(call(_on(fp16utils, 'auto_fp16', forward), torch.ones(1), **kwargs)[1]
                   ) == (F16, F16, {'e': F16})
    named = dict(apply_to=('extra',))  # the ** parameter named: its keywords, in fp16utils
    assert _dtypes(call(_on(fp16_utils(), 'auto_fp16', forward, **named), torch.ones(1),
                        **kwargs)[1]) == (F32, F32, {'e': F32})
    assert _dtypes(call(_on(fp16utils, 'auto_fp16', forward, **named), torch.ones(1),
                        **kwargs)[1]) == (F32, F32, {'e': F16})
    half = {key: value.half() for key, value in kwargs.items()}
    assert _dtypes(call(_on(fp16_utils(), 'force_fp32', forward), torch.ones(1).half(),
                        **half)[1]) == (F32, F16, {'e': F16})
    assert _dtypes(call(_on(fp16utils, 'force_fp32', forward), torch.ones(1).half(),
                        **half)[1]) == (F32, F32, {'e': F32})


for _name in ('auto_fp16', 'force_fp32'):
    shapes(_name, ['difference: apply_to name missing', 'difference: apply_to one string',
                   'difference: out flag not a bool', 'difference: generator',
                   'difference: no parentheses'])


@pytest.mark.parametrize('name', ['auto_fp16', 'force_fp32'])
def test_difference_apply_to_is_checked_when_the_decorator_is_applied(name):
    def forward(self, x, y):
        return x, y

    source = torch.ones(1) if name == 'auto_fp16' else torch.ones(1).half()
    cast = F16 if name == 'auto_fp16' else F32
    # A name the function lacks: mmcv ignores it; fp16utils refuses it at once.
    assert _dtypes(call(_on(fp16_utils(), name, forward, apply_to=('x', 'w')), source,
                        source)[1]) == (cast, source.dtype)
    with pytest.raises(ValueError, match="has no argument 'w'"):
        _on(fp16utils, name, forward, apply_to=('x', 'w'))
    # One string: mmcv matches its substrings ('x' and 'y' are both in 'xy').
    assert _dtypes(call(_on(fp16_utils(), name, forward, apply_to='xy'), source, source)[1]
                   ) == (cast, cast)
    with pytest.raises(ValueError, match="has no argument 'xy'"):
        _on(fp16utils, name, forward, apply_to='xy')
    assert _dtypes(call(_on(fp16utils, name, forward, apply_to='x'), source, source)[1]
                   ) == (cast, source.dtype)


@pytest.mark.parametrize('name', ['auto_fp16', 'force_fp32'])
def test_difference_decorator_arguments_and_targets_are_checked_when_applied(name):
    out_name = 'out_fp32' if name == 'auto_fp16' else 'out_fp16'
    source = torch.ones(1) if name == 'auto_fp16' else torch.ones(1).half()

    def forward(self, x):
        return x

    # A truthy non-bool out flag: mmcv converts the output back; fp16utils refuses it.
    assert call(_on(fp16_utils(), name, forward, **{out_name: 'yes'}), source)[1].dtype == (
        source.dtype)
    with pytest.raises(TypeError, match=f'{out_name}=...'):
        getattr(fp16utils, name)(**{out_name: 'yes'})

    def generate(self, x):
        yield x

    # A generator: mmcv casts, then the body runs later; fp16utils refuses it.
    made = call(_on(fp16_utils(), name, generate), source)[1]
    assert next(made).dtype == (F16 if name == 'auto_fp16' else F32)
    with pytest.raises(TypeError, match='generator'):
        getattr(fp16utils, name)()(generate)
    # Without parentheses: mmcv's method becomes the decorator itself, which fails when
    # called; fp16utils refuses it when applied.
    bare = type('Net', (nn.Module,), {'forward': getattr(fp16_utils(), name)(forward)})()
    status, err = call(bare.forward, source)
    assert status == 'raises' and 'takes 1 positional argument' in str(err)
    with pytest.raises(TypeError, match='without parentheses'):
        getattr(fp16utils, name)(forward)


@compares('force_fp32', ['difference: bfloat16 argument'])
def test_difference_force_fp32_casts_bfloat16_too():
    def forward(self, x):
        return x

    x = torch.ones(1, dtype=BF16)
    assert call(_on(fp16_utils(), 'force_fp32', forward), x)[1].dtype == BF16
    assert call(_on(fp16utils, 'force_fp32', forward), x)[1].dtype == F32
