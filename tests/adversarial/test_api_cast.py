"""Adversarial inputs for ``cast_tensor_type``: cycles, deep nesting, odd containers, dtypes.

Each test is one attack: bad input gets one clear exception naming the problem and
nothing is changed, or the documented result comes back (never a silent wrong one).
"""

from __future__ import annotations

import copy
import pickle
import re
from collections import OrderedDict, UserDict, namedtuple

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp16utils import cast_tensor_type
from fp16utils.cast import MAX_DEPTH

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
Pair = namedtuple('Pair', 'a b')


def f32(n=2):
    return torch.ones(n)


# --------------------------------------------------------------------------- cycles


def test_list_holding_itself_with_tensors_to_cast_is_a_clear_error_and_unchanged():
    inp = [f32()]
    inp.append(inp)
    with pytest.raises(ValueError, match='contains itself'):
        cast_tensor_type(inp, F32, F16)
    assert inp[0].dtype == F32 and inp[1] is inp


def test_dict_holding_itself_with_tensors_to_cast_is_a_clear_error():
    inp = {'x': f32()}
    inp['self'] = inp
    with pytest.raises(ValueError, match='dict that contains itself'):
        cast_tensor_type(inp, F32, F16)
    assert inp['x'].dtype == F32


def test_indirect_cycle_through_two_containers_is_an_error():
    a, b = [f32()], {'n': 1}
    a.append(b)
    b['back'] = a
    with pytest.raises(ValueError, match='contains itself'):
        cast_tensor_type((a,), F32, F16)
    assert a[0].dtype == F32


def test_cycle_with_nothing_to_cast_comes_back_as_the_same_object():
    inp = [torch.arange(2), 'x']
    inp.append(inp)
    assert cast_tensor_type(inp, F32, F16) is inp
    assert inp[2] is inp


def test_cycle_beside_a_castable_sibling_outside_it_casts_the_sibling():
    loop = [torch.arange(2)]
    loop.append(loop)
    out = cast_tensor_type({'x': f32(), 'loop': loop}, F32, F16)
    assert out['x'].dtype == F16
    assert out['loop'] is loop  # the cycle had nothing to cast: kept as it is


def test_the_same_container_twice_is_not_a_cycle():
    shared = [f32()]
    out = cast_tensor_type([shared, shared], F32, F16)
    assert [t.dtype for part in out for t in part] == [F16, F16]
    assert shared[0].dtype == F32


# --------------------------------------------------------------------------- depth


def _nest(leaf, depth):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def test_nesting_at_the_limit_is_cast():
    out = cast_tensor_type(_nest(f32(), MAX_DEPTH), F32, F16)
    for _ in range(MAX_DEPTH):
        out = out[0]
    assert out.dtype == F16


@pytest.mark.parametrize('depth', [MAX_DEPTH + 1, 5000])
def test_nesting_past_the_limit_is_a_clear_error_not_a_recursion_error(depth):
    inp = _nest(f32(), depth)
    with pytest.raises(ValueError, match=f'nested more than {MAX_DEPTH} deep'):
        cast_tensor_type(inp, F32, F16)


# --------------------------------------------------------------------------- odd containers


class TwoArgs(list):
    """A list subclass whose constructor cannot take the list of its items."""

    def __init__(self, a, b):
        super().__init__([a, b])


class Frozen(dict):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)


def test_unrebuildable_container_is_refused_naming_its_class_and_nothing_is_cast():
    inp = TwoArgs(f32(), 2)
    with pytest.raises(TypeError, match=r'cannot rebuild a .*TwoArgs with its tensors cast: '
                                        r'its constructor refused'):
        cast_tensor_type(inp, F32, F16)
    assert inp[0].dtype == F32 and inp[1] == 2
    # Nothing to cast inside: the very same object, no error.
    plain = TwoArgs(torch.ones(1, dtype=torch.int64), 2)
    assert cast_tensor_type(plain, F32, F16) is plain


def test_mapping_whose_constructor_takes_keywords_only_is_refused():
    inp = Frozen(x=f32())
    with pytest.raises(TypeError, match=r'Frozen\(a dict of the items\)'):
        cast_tensor_type(inp, F32, F16)
    assert inp['x'].dtype == F32


def test_unrebuildable_inner_container_refuses_the_whole_input():
    inner = TwoArgs(f32(), 1)
    inp = {'inner': inner, 'n': 3}
    with pytest.raises(TypeError, match='TwoArgs'):
        cast_tensor_type(inp, F32, F16)
    assert inner[0].dtype == F32


class _Lossy(UserDict):
    """A mapping whose constructor takes a dict but keeps its own (uncast) tensors."""

    def __init__(self, data=None):
        super().__init__({'w': torch.ones(1)})


def test_a_rebuilt_mapping_that_still_holds_tensors_to_cast_is_refused():
    with pytest.raises(TypeError, match='does not hold the cast items'):
        cast_tensor_type(_Lossy(), F32, F16)


def test_namedtuple_ordered_dict_and_torch_size_keep_their_types():
    size = torch.Size([2, 3])
    out = cast_tensor_type(OrderedDict(p=Pair(f32(), size)), F32, BF16)
    assert type(out) is OrderedDict and type(out['p']) is Pair
    assert out['p'].a.dtype == BF16 and out['p'].b is size


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize('src', ['float32', 1, str, np.ndarray, float, np.float32])
def test_src_type_that_is_not_a_torch_dtype_matches_no_tensor_as_in_mmcv(src):
    inp = [f32()]
    assert cast_tensor_type(inp, src, F16) is inp
    assert inp[0].dtype == F32


@pytest.mark.parametrize(('dst', 'reason'), [
    ('float16', "pass the dtype torch.float16, not the string 'float16'"),
    (str, 'pass a torch dtype'),
    (np.ndarray, 'pass a torch dtype'),
    (np.dtype('float16'), 'pass a torch dtype'),
])
def test_dst_type_that_tensor_to_refuses_is_a_type_error_naming_it(dst, reason):
    x = f32()
    inp = {'a': [torch.arange(2), x]}
    with pytest.raises(TypeError, match=f'refused dst_type={re.escape(repr(dst))}.*{reason}'):
        cast_tensor_type(inp, F32, dst)
    assert x.dtype == F32 and inp['a'][1] is x


@pytest.mark.parametrize('dst', ['float16', str, np.ndarray, object()])
def test_dst_type_is_not_looked_at_when_no_tensor_matches(dst):
    inp = ['tensor', np.ones(2), 5, torch.arange(2)]
    assert cast_tensor_type(inp, F32, dst) is inp


@pytest.mark.parametrize(('dst', 'dtype'), [(float, torch.float64), (int, torch.int64),
                                            (bool, torch.bool)])
def test_python_scalar_type_as_dst_is_what_tensor_to_makes_of_it(dst, dtype):
    x = torch.tensor([1.5])
    out = cast_tensor_type([x, torch.arange(2)], F32, dst)
    assert out[0].dtype == dtype == x.to(dst).dtype
    assert torch.equal(out[0], x.to(dst))
    assert out[1].dtype == torch.int64


def test_device_or_tensor_as_dst_is_passed_to_tensor_to():
    x = f32()
    on_meta = cast_tensor_type({'x': x}, F32, 'meta')['x']
    assert on_meta.device.type == 'meta' and on_meta.dtype == F32
    like = torch.empty(0, dtype=BF16, device='meta')
    out = cast_tensor_type((x,), F32, like)[0]
    assert out.device.type == 'meta' and out.dtype == BF16
    assert cast_tensor_type([x], F32, torch.device('cpu'))[0].dtype == F32


def test_none_dtypes_return_the_input_as_mmcv_does():
    inp = [f32()]
    assert cast_tensor_type(inp, None, F16) is inp
    assert cast_tensor_type(5, None, None) == 5


def test_non_float_destination_is_a_plain_cast():
    out = cast_tensor_type([torch.tensor([1.7])], F32, torch.int64)
    assert out[0].dtype == torch.int64 and out[0].item() == 1


# --------------------------------------------------------------------------- copies


def test_result_survives_deepcopy_and_pickle():
    out = cast_tensor_type({'p': Pair(f32(), 'x')}, F32, F16)
    for copied in (copy.deepcopy(out), pickle.loads(pickle.dumps(out))):
        assert type(copied['p']) is Pair and copied['p'].a.dtype == F16


# --------------------------------------------------------------------------- properties

PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

leaves = st.one_of(
    st.sampled_from([F32, F16, torch.int64]).map(lambda d: torch.ones(2, dtype=d)),
    st.integers(-3, 3), st.text(max_size=2), st.none())
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3),
        st.dictionaries(st.text(max_size=2), children, min_size=1, max_size=3)),
    max_leaves=10)


def _containers(obj, found, path=()):
    """``(container, its ancestors and itself)`` for every list and dict in ``obj``."""
    if isinstance(obj, (list, dict)):
        path = (*path, obj)
        found.append((obj, path))
        for value in (obj.values() if isinstance(obj, dict) else obj):
            _containers(value, found, path)
    return found


def _dtypes(obj, seen=None):
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [obj.dtype]
    if isinstance(obj, (list, dict)) and id(obj) not in seen:
        seen.add(id(obj))
        values = obj.values() if isinstance(obj, dict) else obj
        return [d for v in values for d in _dtypes(v, seen)]
    return []


@PROPERTY
@given(st.lists(trees, min_size=1, max_size=3), st.data())
def test_property_a_cycle_is_kept_or_refused_never_half_cast(root, data):
    containers = _containers(root, [])
    holder, path = data.draw(st.sampled_from(containers))
    target = data.draw(st.sampled_from(path))  # the holder itself or one it sits in
    if isinstance(holder, dict):
        holder['loop'] = target
    else:
        holder.append(target)
    before = _dtypes(root)
    if F32 in _dtypes(target):  # the cycle itself holds something to cast
        with pytest.raises(ValueError, match='contains itself'):
            cast_tensor_type(root, F32, F16)
    else:
        out = cast_tensor_type(root, F32, F16)
        assert (out is root) == (F32 not in before)
        assert F32 not in _dtypes(out) and len(_dtypes(out)) == len(before)
    assert _dtypes(root) == before  # the input itself never changes
