"""The torch layer's layout: small modules, callers import submodules, no private torch
reads elsewhere."""

import ast
import re
from pathlib import Path

import pytest
from torch import nn

from fp16utils import _torch

ROOT = Path(__file__).resolve().parents[1] / 'fp16utils'
TORCH_DIR = ROOT / '_torch'
SUBMODULES = sorted(p for p in TORCH_DIR.glob('*.py') if p.name != '__init__.py')
SIBLINGS = {p.stem for p in SUBMODULES}

#: Private attributes of torch objects (GradScaler, optimizers, modules, tensors, autocast).
PRIVATE_ATTRS = frozenset({
    '_scale', '_per_optimizer_states', '_found_inf_per_device',
    '_step_supports_amp_scaling', '_parameters', '_buffers', '_modules', '_values',
    '_indices', '_enabled', '_foreach_zero_', '_foreach_div_', '_foreach_copy_',
    '_amp_foreach_non_finite_check_and_unscale_', '_flatten_dense_tensors',
    '_unflatten_dense_tensors', '_group_tensors_by_device_and_dtype', '_jit_internal',
    '_utils', '_C', '_dynamo', '_len_torch_dispatch_stack', '_is_any_autocast_enabled',
    '_is_torch_function_mode_enabled', '_opt_called', '_forward_hooks',
    '_forward_pre_hooks', '_backward_hooks', '_state_dict_hooks',
})
#: ``torch._anything``, ``torch.x._anything`` and the like, in code or in a string.
TORCH_PRIVATE = re.compile(r'\btorch(\.[A-Za-z]\w*)*\._(?!_)\w')


def test_every_torch_module_is_under_500_lines():
    long = {p.name: n for p in TORCH_DIR.glob('*.py')
            if (n := len(p.read_text(encoding='utf-8').splitlines())) >= 500}
    assert long == {}


@pytest.mark.parametrize('path', SUBMODULES, ids=lambda p: p.name)
def test_submodules_never_import_from_the_package_init(path):
    tree = ast.parse(path.read_text(encoding='utf-8'))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module is None:  # from . import x: siblings only
                bad += [a.name for a in node.names if a.name not in SIBLINGS]
            elif node.level == 2 and node.module == '_torch':  # from .._torch import x
                bad += [a.name for a in node.names]
            elif node.level == 2 and node.module is None:  # from .. import _torch
                bad += [a.name for a in node.names if a.name == '_torch']
            elif node.level == 0 and (node.module or '') == 'fp16utils._torch':
                bad += [a.name for a in node.names]
            elif node.level == 0 and node.module == 'fp16utils':
                bad += [a.name for a in node.names if a.name == '_torch']
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name == 'fp16utils._torch']
    assert bad == []


def test_the_checks_above_catch_an_upward_import():
    upward = ast.parse('from . import resolve_dtype\nfrom .. import _torch as _core\n')
    names = [a.name for n in ast.walk(upward) if isinstance(n, ast.ImportFrom)
             for a in n.names]
    assert names == ['resolve_dtype', '_torch'] and 'resolve_dtype' not in SIBLINGS


def test_package_init_imports_its_submodules_and_nothing_else():
    tree = ast.parse((TORCH_DIR / '__init__.py').read_text(encoding='utf-8'))
    body = [n for n in tree.body if not (isinstance(n, ast.Expr)
                                         and isinstance(n.value, ast.Constant))]
    imported = [a.name for n in body if isinstance(n, ast.ImportFrom) and n.level == 1
                and n.module is None for a in n.names]
    assert all(isinstance(n, ast.ImportFrom) for n in body[1:]), body
    assert sorted(imported) == sorted(SIBLINGS)
    assert not hasattr(_torch, '__all__')


def _torch_names_taken(path: Path) -> list:
    """What a module outside ``_torch`` takes from it other than a submodule."""
    tree = ast.parse(path.read_text(encoding='utf-8'))
    taken = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = '.' * node.level + (node.module or '')
            if module.rstrip('.').endswith('_torch') and module.lstrip('.') in (
                    '_torch', 'fp16utils._torch'):
                taken += [a.name for a in node.names if a.name not in SIBLINGS]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == '_torch' and node.attr not in SIBLINGS):
            taken.append(f'_torch.{node.attr}')
    return taken


def test_callers_import_the_torch_submodule_they_use():
    found = {str(p.relative_to(ROOT)): names for p in ROOT.rglob('*.py')
             if TORCH_DIR not in p.parents and (names := _torch_names_taken(p))}
    assert found == {}


def test_the_caller_check_catches_a_name_taken_from_the_package(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text('from .._torch import resolve_dtype\nfrom . import _torch\n_torch.refresh()\n'
                   'from .._torch import versions\n')
    assert _torch_names_taken(bad) == ['resolve_dtype', '_torch.refresh']



def test_reexports_are_the_defining_modules_objects():
    assert _torch.versions.resolve_backend is _torch.versions.resolve_backend
    assert _torch.autocast.call_autocast is _torch.autocast.call_autocast
    assert _torch.factory.make_grad_scaler is _torch.factory.make_grad_scaler
    assert _torch.probes._probe_cache is _torch.probes._probe_cache
    assert _torch.models.module_device_type is _torch.models.module_device_type


# ------------------------------------------------------------- model helpers


class _Wrapper(nn.Module):
    """A DDP-like wrapper: the model is its ``module`` attribute."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_unwrap_model_looks_through_data_parallel_only_by_default():
    inner = nn.Linear(2, 2)
    assert _torch.models.unwrap_model(inner) is inner
    assert _torch.models.unwrap_model(nn.DataParallel(inner)) is inner  # no GPU: still wraps
    wrapped = _Wrapper(inner)
    assert _torch.models.unwrap_model(wrapped) is wrapped  # not a DataParallel/DDP
    assert _torch.models.unwrap_model(wrapped, any_wrapper=True) is inner
    assert _torch.models.unwrap_model(nn.DataParallel(nn.DataParallel(inner))).module is inner


def test_module_device_type_parameters_then_buffers_then_default():
    assert _torch.models.module_device_type(nn.Linear(1, 1)) == 'cpu'
    assert _torch.models.module_device_type(nn.Linear(1, 1, device='meta')) == 'meta'
    bn = nn.BatchNorm1d(2, affine=False).to('meta')  # buffers only
    assert list(bn.parameters()) == [] and _torch.models.module_device_type(bn) == 'meta'
    assert _torch.models.module_device_type(nn.ReLU()) == 'cpu'
    assert _torch.models.module_device_type(nn.ReLU(), None) is None
    assert _torch.models.module_device_type(nn.ReLU(), 'cuda') == 'cuda'
    assert _torch.models.module_device_type(object()) == 'cpu'
    mixed = nn.Sequential(nn.BatchNorm1d(2, affine=False), nn.Linear(1, 1, device='meta'))
    assert _torch.models.module_device_type(mixed) == 'meta'  # a parameter wins over a buffer


def test_module_device_type_cache_follows_moves_and_swaps():
    model = nn.Sequential(nn.Linear(1, 1))
    path = _torch.models.TensorPath()
    assert _torch.models.module_device_type(model, cache=path) == 'cpu'
    assert path.name == 'weight' and path.owner() is model[0]
    model.to('meta')  # the path is read anew: the move is seen
    assert _torch.models.module_device_type(model, cache=path) == 'meta'
    model[0] = nn.Linear(1, 1)  # the cached owner is gone from the model: walked again
    assert _torch.models.module_device_type(model, cache=path) in ('cpu', 'meta')
    other = nn.Linear(1, 1, device='meta')
    assert _torch.models.module_device_type(other, cache=path) == 'meta'  # another model: walked
    assert path.model() is other
    import pickle
    copy = pickle.loads(pickle.dumps(path))
    assert copy.model is None and copy.owner is None  # a copy keeps nothing alive


def test_module_device_type_cache_of_a_buffer_only_model():
    model = nn.BatchNorm1d(2, affine=False)
    path = _torch.models.TensorPath()
    assert _torch.models.module_device_type(model, cache=path) == 'cpu'
    assert path.name == 'running_mean'
    model.to('meta')
    assert _torch.models.module_device_type(model, cache=path) == 'meta'
    assert _torch.models.own_tensor(model, 'running_mean').device.type == 'meta'
    assert _torch.models.own_tensor(model, 'nothing') is None


# ----------------------------------------------- no private torch reads outside _torch


def private_torch_reads(source: str) -> list:
    """(line, text) of every private torch read in ``source``: ``torch._x`` or a known name."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRS and not (
                isinstance(node.value, ast.Name) and node.value.id in ('self', 'cls')):
            found.append((node.lineno, node.attr))  # self._scale: an own attribute
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value in PRIVATE_ATTRS):
            found.append((node.lineno, node.value))  # getattr(obj, '_scale', ...)
        elif isinstance(node, ast.ImportFrom) and (node.module or '').startswith('torch') and (
                any(part.startswith('_') for part in node.module.split('.'))
                or any(a.name.startswith('_') for a in node.names)):
            found.append((node.lineno, node.module))
    for lineno, line in enumerate(source.splitlines(), 1):
        code = line.split('#', 1)[0]
        if TORCH_PRIVATE.search(code) and not code.lstrip().startswith(('>>>', '...')):
            found.append((lineno, code.strip()))
    return sorted(set(found))


def test_no_private_torch_read_outside_the_torch_layer():
    bad = []
    for path in sorted(ROOT.rglob('*.py')):
        if TORCH_DIR in path.parents:
            continue
        for lineno, what in private_torch_reads(path.read_text(encoding='utf-8')):
            bad.append(f'{path.relative_to(ROOT)}:{lineno}: {what}')
    assert bad == []


@pytest.mark.parametrize('code', [
    'x = torch._C._len_torch_dispatch_stack()',
    'torch._foreach_zero_(grads)',
    'v = grad._values()',
    "flag = getattr(scaler, '_scale', None)",
    'states = scaler._per_optimizer_states',
    'ok = optimizer._step_supports_amp_scaling',
    'from torch._utils import _flatten_dense_tensors',
    'import torch\ntorch._dynamo.reset()',
    'from torch.nn.modules.batchnorm import _BatchNorm',
    'owner._parameters.get(name)',
])
def test_the_scan_finds_a_private_read(code):
    assert private_torch_reads(code) != []


def test_the_scan_leaves_public_and_own_names_alone():
    code = ('self._scale = 1.0\nv = torch.__version__\nx = torch.float16\n'
            'y = torch.autocast("cpu")\nt = torch.nn.utils.clip_grad_norm_\nz = obj._own_name\n')
    assert private_torch_reads(code) == []
