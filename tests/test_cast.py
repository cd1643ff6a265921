"""Tests for cast_tensor_type: the mmcv contract, the extra container types, properties."""

import collections
import types
from collections import OrderedDict, defaultdict, deque, namedtuple

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from fp16utils import cast_tensor_type

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

Pair = namedtuple('Pair', ['left', 'right'])


def f32(*values):
    return torch.tensor(values or (1.0, 2.0), dtype=F32)


# --------------------------------------------------------------------------- mmcv contract


def test_module_returned_as_is():
    module = nn.Linear(2, 2)
    assert cast_tensor_type(module, F32, F16) is module
    assert module.weight.dtype == F32
    seq = nn.Sequential(nn.Linear(2, 2))  # iterable, but still a module
    assert cast_tensor_type(seq, F32, F16) is seq
    assert cast_tensor_type([module], F32, F16)[0] is module


@pytest.mark.parametrize(('src', 'dst'), [(F32, F16), (F32, BF16), (F16, F32), (BF16, F32)])
def test_tensor_of_src_dtype_converted(src, dst):
    x = torch.tensor([1.5, -2.0, 0.25], dtype=src)
    out = cast_tensor_type(x, src, dst)
    assert out.dtype == dst
    assert torch.equal(out.to(src), x)
    assert x.dtype == src  # the input is not modified


@pytest.mark.parametrize('dtype', [torch.int64, torch.int32, torch.bool, torch.uint8,
                                   torch.float64, F16, BF16])
def test_tensor_of_other_dtype_same_object(dtype):
    x = torch.ones(3, dtype=dtype)
    assert cast_tensor_type(x, F32, F16) is x


def test_int_tensor_stays_int_next_to_float():
    ids = torch.arange(3)
    out = cast_tensor_type({'ids': ids, 'x': f32()}, F32, F16)
    assert out['ids'] is ids and out['ids'].dtype == torch.int64
    assert out['x'].dtype == F16


@pytest.mark.parametrize(('inputs', 'src', 'dst'), [
    ('tensor', str, str),
    (np.array([5.0]), np.ndarray, np.ndarray),
    (5, None, None),
    ([torch.ones(1)], None, F16),
    ([torch.ones(1)], F32, None),
])
def test_call_shapes_of_mmcvs_own_tests_return_the_input(inputs, src, dst):
    assert cast_tensor_type(inputs, src, dst) is inputs


def test_integer_destination_as_in_mmcvs_own_tests():
    out = cast_tensor_type({'a': torch.tensor([1.7]), 'b': [torch.tensor([2.2])]}, F32,
                           torch.int32)
    assert out['a'].dtype == out['b'][0].dtype == torch.int32
    assert (out['a'].item(), out['b'][0].item()) == (1, 2)


def test_cast_keeps_autograd_graph():
    x = torch.ones(3, requires_grad=True)
    out = cast_tensor_type(x, F32, F16)
    assert out.requires_grad and out.dtype == F16
    (out.float() * 3).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))


@pytest.mark.parametrize('obj', ['a string', b'bytes', bytearray(b'ba'),
                                 np.ones(3, dtype=np.float32), np.array(['x'])])
def test_atoms_returned_as_is(obj):
    assert cast_tensor_type(obj, F32, F16) is obj


@pytest.mark.parametrize('obj', [5, 2.5, True, None, 1 + 2j, Ellipsis])
def test_scalars_returned_as_is(obj):
    assert cast_tensor_type(obj, F32, F16) is obj


def test_anything_else_returned_as_is():
    obj = object()
    assert cast_tensor_type(obj, F32, F16) is obj
    assert cast_tensor_type(5, None, None) == 5
    assert cast_tensor_type('x', None, None) == 'x'


def test_mapping_rebuilt_same_type():
    inp = {'a': f32(), 'b': 'text', 'c': 3}
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is dict and out is not inp
    assert list(out) == ['a', 'b', 'c']
    assert out['a'].dtype == F16
    assert out['b'] is inp['b'] and out['c'] == 3
    assert inp['a'].dtype == F32  # the input dict is not modified


def test_dict_subclass_keeps_type():
    class MyDict(dict):
        pass

    out = cast_tensor_type(MyDict(x=f32()), F32, F16)
    assert type(out) is MyDict
    assert out['x'].dtype == F16


def test_mapping_proxy_is_cast():
    # A Mapping type that must be built from a dict (mmcv passes a dict).
    inp = types.MappingProxyType({'x': f32()})
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is types.MappingProxyType
    assert out['x'].dtype == F16


def test_custom_mapping_wrapping_a_dict():
    class Wrapped(collections.abc.Mapping):
        def __init__(self, data):
            self._data = data

        def __getitem__(self, key):
            return self._data[key]

        def __iter__(self):
            return iter(self._data)

        def __len__(self):
            return len(self._data)

    out = cast_tensor_type(Wrapped({'x': f32(), 'n': 1}), F32, F16)
    assert type(out) is Wrapped
    assert out['x'].dtype == F16 and out['n'] == 1


@pytest.mark.parametrize('container', [list, tuple])
def test_list_and_tuple_keep_type(container):
    keep = torch.arange(2)
    inp = container([f32(), keep, 'k', None])
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is container
    assert out[0].dtype == F16
    assert out[1] is keep and out[2] == 'k' and out[3] is None


def test_list_subclass_keeps_type():
    class MyList(list):
        pass

    out = cast_tensor_type(MyList([f32()]), F32, F16)
    assert type(out) is MyList and out[0].dtype == F16


# --------------------------------------------------------------------------- beyond mmcv


def test_namedtuple_keeps_type_and_fields():
    keep = torch.arange(2)
    inp = Pair(left=f32(), right=keep)
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is Pair
    assert out._fields == ('left', 'right')
    assert out.left.dtype == F16 and out.right is keep


def test_torch_return_types_keep_type():
    result = torch.max(torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=F16), dim=1)
    out = cast_tensor_type(result, F16, F32)
    assert type(out) is type(result)
    assert out.values.dtype == F32 and torch.equal(out.values, torch.tensor([3.0, 2.0]))
    assert out.indices is result.indices


def test_defaultdict_keeps_factory():
    inp = defaultdict(list)
    inp['x'] = f32()
    inp['y'] = [f32()]
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is defaultdict
    assert out.default_factory is list
    assert out['x'].dtype == F16 and out['y'][0].dtype == F16
    assert out['missing'] == []  # the factory still works


def test_defaultdict_subclass_keeps_type_and_factory():
    class Counts(defaultdict):
        pass

    inp = Counts(int, x=f32())
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is Counts and out.default_factory is int
    assert out['x'].dtype == F16


def test_ordered_dict_keeps_order():
    keys = ['z', 'a', 'm', 'b']
    inp = OrderedDict((k, f32(float(i))) for i, k in enumerate(keys))
    inp.move_to_end('z')
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is OrderedDict
    assert list(out) == list(inp) == ['a', 'm', 'b', 'z']
    assert [v.item() for v in out.values()] == [1.0, 2.0, 3.0, 0.0]
    assert all(v.dtype == F16 for v in out.values())


@pytest.mark.parametrize('container', [set, frozenset])
def test_sets_keep_type(container):
    keep = torch.arange(2)
    inp = container([f32(), keep, 'k', 7])
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is container
    assert len(out) == 4
    tensors = [v for v in out if isinstance(v, torch.Tensor)]
    assert sorted(str(t.dtype) for t in tensors) == ['torch.float16', 'torch.int64']
    assert keep in out and 'k' in out and 7 in out


@pytest.mark.parametrize('maxlen', [None, 3])
def test_deque_keeps_maxlen(maxlen):
    inp = deque([f32(), 1, f32()], maxlen=maxlen)
    out = cast_tensor_type(inp, F32, F16)
    assert type(out) is deque
    assert out.maxlen == maxlen
    assert [getattr(v, 'dtype', v) for v in out] == [F16, 1, F16]


def test_nested_mix():
    keep = torch.arange(3)
    inner_untouched = {'ids': keep, 'name': 'n'}
    inp = {
        'a': [f32(), (f32(), Pair(f32(), 'r'))],
        'b': OrderedDict(c={f32()}, d=deque([f32()], maxlen=2)),
        'e': inner_untouched,
        'f': torch.ones(1, dtype=F16),
    }
    out = cast_tensor_type(inp, F32, F16)
    assert out['a'][0].dtype == F16
    assert type(out['a'][1]) is tuple and out['a'][1][0].dtype == F16
    pair = out['a'][1][1]
    assert type(pair) is Pair and pair.left.dtype == F16 and pair.right == 'r'
    assert type(out['b']) is OrderedDict
    assert next(iter(out['b']['c'])).dtype == F16
    assert out['b']['d'].maxlen == 2 and out['b']['d'][0].dtype == F16
    # Sub-containers with nothing to cast come back as the same objects.
    assert out['e'] is inner_untouched
    assert out['f'] is inp['f']


def test_generator_not_consumed():
    items = [f32(), f32()]
    gen = (t for t in items)
    assert cast_tensor_type(gen, F32, F16) is gen
    got = list(gen)
    assert len(got) == 2 and got[0] is items[0] and got[1] is items[1]


@pytest.mark.parametrize('make', [
    lambda items: iter(items),
    lambda items: map(lambda t: t, items),
    lambda items: zip(items, items),
    lambda items: enumerate(items),
    lambda items: reversed(items),
])
def test_iterators_not_consumed(make):
    items = [f32(), f32(), f32()]
    it = make(items)
    assert cast_tensor_type(it, F32, F16) is it
    assert len(list(it)) == 3


def test_range_and_bytes_not_rebuilt():
    r = range(5)
    assert cast_tensor_type(r, F32, F16) is r
    assert list(r) == [0, 1, 2, 3, 4]
    mv = memoryview(b'abc')
    assert cast_tensor_type(mv, F32, F16) is mv


def test_generator_inside_container_not_consumed():
    gen = (t for t in [f32()])
    out = cast_tensor_type([f32(), gen], F32, F16)
    assert out[0].dtype == F16 and out[1] is gen
    assert len(list(gen)) == 1


@pytest.mark.parametrize('inp', [
    [torch.arange(3), 'x', 1],
    (torch.ones(1, dtype=F16), None),
    {'a': {'b': [torch.ones(1, dtype=BF16)]}},
    {torch.arange(1), 'x'},
    Pair(1, 'x'),
    deque([1, 2]),
    defaultdict(list, a=[1]),
    OrderedDict(a=1),
    [],
    {},
])
def test_identity_when_nothing_to_cast(inp):
    assert cast_tensor_type(inp, F32, F16) is inp


@pytest.mark.parametrize(('src', 'dst'), [(F32, F32), (None, F16), (F32, None), (None, None)])
def test_identity_when_no_cast_asked(src, dst):
    inp = {'x': f32(), 'y': [f32()]}
    assert cast_tensor_type(inp, src, dst) is inp
    assert inp['x'].dtype == F32


def test_partial_change_keeps_untouched_siblings():
    untouched = [torch.arange(2), 'x']
    inp = ([f32()], untouched)
    out = cast_tensor_type(inp, F32, F16)
    assert out is not inp and out[0] is not inp[0]
    assert out[1] is untouched


# --------------------------------------------------------------------------- properties

DTYPES = [F32, F16, BF16, torch.float64, torch.int64, torch.bool]


@st.composite
def tensors(draw, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    # Small integers are exact in float16 and bfloat16: round trips are lossless.
    values = draw(st.lists(st.integers(-256, 256), min_size=0, max_size=4))
    if dtype is torch.bool:
        values = [v > 0 for v in values]
    return torch.tensor(values, dtype=dtype)


def leaves(dtypes=DTYPES):
    return st.one_of(tensors(dtypes), st.integers(-5, 5), st.text(max_size=3), st.none())


def hashable_leaves(dtypes=DTYPES):
    return st.one_of(tensors(dtypes), st.integers(-5, 5), st.text(max_size=3))


def nested(dtypes=DTYPES):
    return st.recursive(
        leaves(dtypes),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.lists(children, max_size=4).map(tuple),
            st.dictionaries(st.text(max_size=3), children, max_size=4),
            st.frozensets(hashable_leaves(dtypes), max_size=4),
            st.sets(hashable_leaves(dtypes), max_size=4),
            st.tuples(children, children).map(lambda t: Pair(*t)),
        ),
        max_leaves=12,
    )


def contains(obj, dtype):
    if isinstance(obj, torch.Tensor):
        return obj.dtype == dtype
    if isinstance(obj, dict):
        return any(contains(v, dtype) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(contains(v, dtype) for v in obj)
    return False


def tensor_key(t, dtype=None):
    return (str(dtype or t.dtype), tuple(t.double().tolist()))


def check_cast(inp, out, src, dst):
    """Assert ``out`` is ``inp`` with exactly its ``src`` tensors turned into ``dst``."""
    if not contains(inp, src):
        assert out is inp
    if isinstance(inp, torch.Tensor):
        if inp.dtype == src:
            assert out.dtype == dst and out.shape == inp.shape
            assert torch.equal(out.to(src), inp)
        else:
            assert out is inp
        return
    assert type(out) is type(inp)
    if isinstance(inp, dict):
        assert list(out) == list(inp)
        for key in inp:
            check_cast(inp[key], out[key], src, dst)
    elif isinstance(inp, (list, tuple)):
        assert len(out) == len(inp)
        for a, b in zip(inp, out):
            check_cast(a, b, src, dst)
    elif isinstance(inp, (set, frozenset)):
        assert len(out) == len(inp)
        plain = {v for v in inp if not isinstance(v, torch.Tensor)}
        assert {v for v in out if not isinstance(v, torch.Tensor)} == plain
        expected = sorted(tensor_key(t, dst if t.dtype == src else t.dtype)
                          for t in inp if isinstance(t, torch.Tensor))
        got = sorted(tensor_key(t) for t in out if isinstance(t, torch.Tensor))
        assert got == expected
        kept = [t for t in inp if isinstance(t, torch.Tensor) and t.dtype != src]
        assert all(t in out for t in kept)  # same objects (tensors hash by id)
    else:
        assert out is inp


PROPERTY = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
CASTS = st.sampled_from([(F32, F16), (F32, BF16), (F16, F32), (BF16, F32),
                         (torch.float64, F32), (torch.int64, F32)])


@PROPERTY
@given(nested(), CASTS)
def test_property_only_src_tensors_change(inp, cast):
    src, dst = cast
    out = cast_tensor_type(inp, src, dst)
    check_cast(inp, out, src, dst)


@PROPERTY
@given(nested(), st.sampled_from(DTYPES))
def test_property_identity_when_src_equals_dst(inp, dtype):
    assert cast_tensor_type(inp, dtype, dtype) is inp


@PROPERTY
@given(nested([F16, BF16, torch.int64, torch.bool]))
def test_property_identity_without_matching_tensor(inp):
    assert cast_tensor_type(inp, F32, F16) is inp


@PROPERTY
@given(nested([F32, torch.int64]), st.sampled_from([F16, BF16]))
def test_property_round_trip(inp, low):
    there = cast_tensor_type(inp, F32, low)
    assert not contains(there, F32)
    back = cast_tensor_type(there, low, F32)
    if not contains(inp, F32):
        assert there is inp and back is inp
    assert _canonical(back) == _canonical(inp)


def _canonical(obj):
    if isinstance(obj, torch.Tensor):
        return ('T',) + tensor_key(obj)
    if isinstance(obj, dict):
        return ('dict', tuple((k, _canonical(v)) for k, v in obj.items()))
    if isinstance(obj, (set, frozenset)):
        return (type(obj).__name__, tuple(sorted(map(repr, map(_canonical, obj)))))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(_canonical(v) for v in obj))
    return ('L', type(obj).__name__, obj)
