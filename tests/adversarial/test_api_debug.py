"""Adversarial use of ``find_overflow``, ``nonfinite_summary``, ``OverflowReport`` and
``NonFiniteRecord``: odd inputs, odd models, exceptions, re-entrancy.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fp16utils import NonFiniteRecord, OverflowReport, find_overflow, nonfinite_summary

INF, NAN = float('inf'), float('nan')


def bad(*values, dtype=torch.float32):
    return torch.tensor(values or (1.0, INF), dtype=dtype)


def names(records):
    return [r.name for r in records]


def hooked(model):
    """Modules of ``model`` that still hold a forward hook."""
    return [m for m in model.modules()
            if m._forward_hooks or getattr(m, '_forward_hooks_with_kwargs', None)]


# --------------------------------------------------------------------------- nonfinite_summary


@pytest.mark.parametrize('tensors', [None, 5, 2.5, 'weights', b'xy'])
def test_summary_of_what_is_not_tensors_is_a_type_error(tensors):
    with pytest.raises(TypeError, match='nonfinite_summary\\(\\) takes a module, a tensor'):
        nonfinite_summary(tensors)


@pytest.mark.parametrize('grads', ['no', 1, None])
def test_summary_grads_flag_must_be_a_bool(grads):
    with pytest.raises(TypeError, match='grads=...\\) takes True or False'):
        nonfinite_summary([bad()], grads=grads)


@pytest.mark.parametrize('empty', [[], {}, (), iter(()), nn.ReLU()])
def test_summary_of_nothing_is_empty(empty):
    assert nonfinite_summary(empty) == []


def test_summary_of_one_tensor_judges_the_whole_tensor():
    (rec,) = nonfinite_summary(bad(1.0, INF, NAN))
    assert (rec.name, rec.shape, rec.numel, rec.num_inf, rec.num_nan) == ('0', (3,), 3, 1, 1)
    (rec,) = nonfinite_summary(torch.tensor(INF))  # 0-d: no iteration over it
    assert rec.shape == () and rec.num_inf == 1


def test_summary_of_a_generator_is_consumed_once():
    records = nonfinite_summary(t for t in [torch.ones(1), bad()])
    assert names(records) == ['1']


def test_summary_names_non_string_keys_and_pair_names():
    assert names(nonfinite_summary({3: bad(), 'ok': torch.ones(1)})) == ['3']
    assert names(nonfinite_summary([(7, bad())])) == ['7']


def test_summary_looks_inside_nested_containers():
    records = nonfinite_summary([[torch.ones(1), bad()], {'k': (bad(),)}])
    assert names(records) == ['0[1]', "1['k'][0]"]


@pytest.mark.parametrize('dtype', [torch.int64, torch.bool, torch.uint8])
def test_summary_skips_integer_tensors(dtype):
    assert nonfinite_summary([torch.ones(2, dtype=dtype)]) == []


def test_summary_skips_meta_tensors_which_hold_no_values():
    assert nonfinite_summary([torch.empty(3, device='meta'), bad()]) != []
    assert nonfinite_summary([torch.empty(3, device='meta')]) == []


def test_summary_of_empty_tensors_is_empty():
    assert nonfinite_summary([torch.empty(0), torch.empty(0, 3)]) == []


def test_summary_judges_complex_tensors_on_both_parts():
    (rec,) = nonfinite_summary([torch.tensor([complex(1, NAN), 2 + 0j])])
    assert rec.dtype == torch.complex64 and rec.num_nan == 1 and rec.max_abs == 2.0


@pytest.mark.filterwarnings('ignore:Sparse CSR tensor support:UserWarning')
def test_summary_judges_sparse_tensors_on_their_stored_values():
    (rec,) = nonfinite_summary([bad(0.0, INF, 3.0).to_sparse()])
    assert (rec.shape, rec.numel, rec.num_inf, rec.max_abs) == ((3,), 3, 1, 3.0)
    csr = torch.tensor([[0.0, NAN], [1.0, 0.0]]).to_sparse_csr()
    (rec,) = nonfinite_summary({'csr': csr})
    assert rec.name == 'csr' and rec.num_nan == 1


def test_summary_judges_sparse_gradients():
    p = nn.Parameter(torch.ones(3))
    p.grad = bad(0.0, NAN, 0.0).to_sparse()
    (rec,) = nonfinite_summary([('p', p)], grads=True)
    assert rec.kind == 'grad' and rec.num_nan == 1


@pytest.mark.filterwarnings('ignore:The PyTorch API of nested tensors:UserWarning')
def test_summary_judges_nested_tensors_on_their_components():
    nested = torch.nested.nested_tensor([bad(1.0, INF), torch.ones(3)])
    (rec,) = nonfinite_summary([nested])
    assert rec.numel == 5 and rec.num_inf == 1


def test_summary_reads_8_bit_floats():
    dtype = getattr(torch, 'float8_e5m2', None)
    if dtype is None:
        pytest.skip('torch has no float8_e5m2 dtype here')
    (rec,) = nonfinite_summary([bad(1.0, INF).to(dtype)])
    assert rec.dtype == dtype and rec.num_inf == 1 and rec.max_abs == 1.0


def test_summary_of_tensors_that_require_grad_records_no_graph():
    x = bad().requires_grad_()
    (rec,) = nonfinite_summary([x])
    assert rec.num_inf == 1 and x.grad is None


# --------------------------------------------------------------------------- find_overflow


class Blowup(nn.Module):
    def forward(self, x):
        return x / 0.0


@pytest.mark.parametrize('model', [None, 'model', [nn.Linear(1, 1)], torch.ones(1)])
def test_find_overflow_of_a_non_module_is_a_type_error(model):
    with pytest.raises(TypeError, match='watches an nn.Module'):
        with find_overflow(model):
            pass


@pytest.mark.parametrize('flag', ['check_grads', 'check_outputs'])
def test_find_overflow_flags_must_be_bools_and_nothing_is_attached(flag):
    model = nn.Linear(1, 1)
    with pytest.raises(TypeError, match=f'{flag}=...\\) takes True or False'):
        with find_overflow(model, **{flag: 'no'}):
            pass
    assert hooked(model) == []


def test_find_overflow_on_a_model_without_parameters():
    model = nn.Sequential(nn.ReLU(), Blowup())
    with find_overflow(model) as report:
        model(torch.ones(1))
    assert report.first_module == '1' and report.checked_params == 0


def test_hooks_are_removed_when_the_block_raises():
    model = nn.Sequential(nn.Linear(1, 1), Blowup())
    with pytest.raises(KeyError, match='boom'):
        with find_overflow(model) as report:
            model(torch.ones(1)).sum().backward()
            raise KeyError('boom')
    assert report.first_module == '1'
    assert hooked(model) == []
    counts = report.to_dict()
    model(torch.ones(1)).sum().backward()  # no hook is left: nothing more is recorded
    assert report.to_dict() == counts


def test_find_overflow_used_re_entrantly_fills_both_reports_and_removes_every_hook():
    model = nn.Sequential(nn.Linear(1, 1), Blowup())
    with find_overflow(model) as outer:
        with find_overflow(model[1]) as inner:
            model(torch.ones(1))
        model(torch.ones(1))
    assert outer.first_module == '1' and inner.first_module == '<root>'
    assert outer.checked_outputs == 6 and inner.checked_outputs == 1
    assert hooked(model) == []


def test_scripted_submodules_are_reported_as_unwatched(script):
    model = nn.Sequential(nn.Linear(1, 1), script(Blowup()), nn.Linear(1, 1))
    with pytest.warns(UserWarning, match="cannot watch TorchScript modules.*: 1;"):
        with find_overflow(model) as report:
            model(torch.ones(1)).sum().backward()
    assert report.unwatched == ['1'] and report.to_dict()['unwatched'] == ['1']
    assert report.first_module == '2'  # the first module watched that saw it
    assert "1 TorchScript module(s) not watched: 1" in str(report)
    assert any('were not watched (1)' in hint for hint in report.hints())


def test_a_wholly_scripted_model_does_not_read_as_clean(script):
    model = script(nn.Sequential(nn.Linear(1, 1), Blowup()))
    with pytest.warns(UserWarning, match='<root>'):
        with find_overflow(model) as report:
            model(torch.ones(1))
    assert report.unwatched == ['<root>']
    assert 'not watched: <root>' in str(report)


# --------------------------------------------------------------------------- the records


def test_records_and_reports_serialise_to_json():
    (rec,) = nonfinite_summary({'w': bad(1.0, INF, NAN, dtype=torch.bfloat16)})
    data = rec.to_dict()
    assert json.loads(json.dumps(data)) == data and data['dtype'] == 'bfloat16'
    assert json.loads(json.dumps(OverflowReport().to_dict()))['ok'] is True


def test_record_is_frozen():
    (rec,) = nonfinite_summary([bad()])
    with pytest.raises(AttributeError):
        rec.num_inf = 0


def test_record_with_no_counts_still_describes_itself():
    rec = NonFiniteRecord(kind='value', name='x', dtype=torch.float16, shape=(1,),
                          max_abs=None, num_inf=0, num_nan=0, numel=1)
    assert rec.problem == 'non-finite of 1' and rec.where == 'x'
    assert rec.to_dict()['has_inf'] is False
