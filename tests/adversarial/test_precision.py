"""Attacks on keep_fp32 / fp32_modules, precision_support, dtype='auto' and cache_enabled.

Each attack checks the refusal (the exception and what it names) and that nothing
changed, or, where the input is legal, what came out.
"""

import copy

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import (
    AmpOptimWrapper,
    OptimWrapper,
    OptimWrapperDict,
    build_optim_wrapper,
    enable_amp,
    keep_fp32,
    kept_fp32,
    precision_support,
    wrap_fp16_model,
)
from fp16utils._torch import caps
from fp16utils.tools.cli import main

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
LOW = _caps.LOW


def model():
    return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4),
                         nn.Sequential(nn.Linear(4, 2), nn.ReLU()))


def snapshot(m):
    return ({k: v.clone() for k, v in m.state_dict().items()},
            {n: type(mod.__dict__.get('forward')) for n, mod in m.named_modules()})


def unchanged(m, before):
    state, forwards = snapshot(m)
    assert state.keys() == before[0].keys()
    assert all(torch.equal(state[k], before[0][k]) and state[k].dtype == before[0][k].dtype
               for k in state)
    assert forwards == before[1]


# ---------------------------------------------------------------- keep_fp32

BAD_MODULES = [
    ('typo', ['2.0', '2.9'], ValueError, r"'2\.9' matches no module"),
    ('empty-string', '', ValueError, 'empty pattern'),
    ('case', 'layernorm', ValueError, "'layernorm' matches no module"),
    ('unknown-class-name', 'DeformConv2d', ValueError, "'DeformConv2d' matches no module"),
    ('absent-class', nn.Conv2d, ValueError, 'Conv2d matches no module'),
    ('int-entry', [1], TypeError, r'got 1 \(int\)'),
    ('non-module-class', [dict], TypeError, 'nn.Module subclass'),
    ('module-instance', [nn.LayerNorm(4)], TypeError, 'nn.Module subclass'),
    ('nested-list', [['0']], TypeError, 'nn.Module subclass'),
    ('dict', {'0': True}, TypeError, 'modules must be'),
    ('bytes', b'0', TypeError, 'modules must be'),
    ('number', 3.5, TypeError, 'modules must be'),
    ('module-as-list', nn.Sequential(nn.ReLU()), TypeError, 'modules must be'),
    ('None-inside', ['0', None], TypeError, 'got None'),
    ('nn.Module-itself-by-name', 'Module', ValueError, "'Module' matches no module"),
]


@pytest.mark.parametrize('modules, exc, match', [b[1:] for b in BAD_MODULES],
                         ids=[b[0] for b in BAD_MODULES])
def test_keep_fp32_refuses_and_changes_nothing(modules, exc, match):
    m = model()
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        keep_fp32(m, modules)
    unchanged(m, before)


@pytest.mark.parametrize('out_dtype', ['float32', torch.int8, 'half-ish'])
def test_keep_fp32_bad_out_dtype_changes_nothing(out_dtype):
    m = model()
    before = snapshot(m)
    with pytest.raises(ValueError, match='low-precision dtype'):
        keep_fp32(m, '0', out_dtype=out_dtype)
    unchanged(m, before)


def test_keep_fp32_model_not_a_module():
    with pytest.raises(TypeError, match='model must be an nn.Module, got dict'):
        keep_fp32({'a': nn.Linear(1, 1)}, 'a')


def test_keep_fp32_legal_odd_inputs():
    m = model()
    assert keep_fp32(m, []) is m and kept_fp32(m) == []          # nothing asked: nothing done
    assert keep_fp32(m, None) is m and kept_fp32(m) == []
    keep_fp32(m, (p for p in ['1', '2.*']))                      # a generator, read once
    assert kept_fp32(m) == ['1', '2.0', '2.1']
    keep_fp32(m, ['2', '2.*'])                                   # parent and children nested
    with torch.autocast('cpu', dtype=LOW):
        out = m(torch.ones(1, 4))
    assert out.dtype == F32 and kept_fp32(m) == ['1', '2', '2.0', '2.1']


def test_keep_fp32_hooks_still_see_the_call_and_kwargs_only_calls_work():
    m = keep_fp32(nn.Linear(4, 2), '*')
    seen = []
    m.register_forward_pre_hook(lambda mod, args: seen.append([a.dtype for a in args]))
    with torch.autocast('cpu', dtype=LOW):
        out = m(torch.ones(1, 4, dtype=LOW))
        kw = m(input=torch.ones(1, 4, dtype=LOW))
    assert seen == [[LOW], []]  # the hook sees the call as made; the forward casts inside
    assert out.dtype == kw.dtype == F32


def test_keep_fp32_under_inference_mode_and_with_integer_inputs():
    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 3)

        def forward(self, idx, weight):
            return self.emb(idx) * weight

    m = keep_fp32(Embed(), 'Embed')
    with torch.inference_mode(), torch.autocast('cpu', dtype=LOW):
        out = m(torch.tensor([1, 2]), torch.ones(1, dtype=LOW))
    assert out.dtype == F32


def test_keep_fp32_twice_with_a_deep_copy_between():
    m = keep_fp32(model(), '0')
    clone = copy.deepcopy(m)
    keep_fp32(clone, '0')
    assert clone[0].forward.owner is clone[0] and m[0].forward.owner is m[0]


# ------------------------------------------------ fp32_modules on the users


def test_wrap_fp16_model_bad_fp32_modules_changes_nothing():
    m = model()
    before = snapshot(m)
    with pytest.raises(ValueError, match=r"wrap_fp16_model\(fp32_modules=...\): 'x' matches"):
        wrap_fp16_model(m, dtype=_caps.LEGACY_LOW, backend='legacy', fp32_modules=['x'])
    unchanged(m, before)


def test_amp_wrapper_bad_fp32_modules_at_init_and_at_the_context():
    m = model()
    before = snapshot(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"fp32_modules=...\): 'zz' matches no module"):
        AmpOptimWrapper(opt, dtype=LOW, model=m, fp32_modules='zz')
    with pytest.raises(ValueError, match="'zz' matches no module"):
        AmpOptimWrapper(opt, dtype=_caps.LEGACY_LOW, backend='legacy', model=m,
                        fp32_modules='zz')
    unchanged(m, before)
    assert all(p.dtype == F32 for g in opt.param_groups for p in g['params'])
    wrapper = AmpOptimWrapper(opt, dtype=LOW, fp32_modules=['zz'])
    with pytest.raises(ValueError, match="'zz' matches no module"):
        wrapper.optim_context(m)
    unchanged(m, before)


def test_build_optim_wrapper_bad_fp32_modules():
    m = model()
    before = snapshot(m)
    with pytest.raises(TypeError, match='fp32_modules'):
        build_optim_wrapper(m, dict(type='AmpOptimWrapper', fp32_modules={'0': 1},
                                    optimizer=dict(type='SGD', lr=0.1)))
    with pytest.raises(ValueError, match="'nope' matches no module"):
        build_optim_wrapper(m, dict(type='AmpOptimWrapper', fp32_modules='nope',
                                    optimizer=dict(type='SGD', lr=0.1)))
    unchanged(m, before)


# ------------------------------------------------------- precision_support

BAD_DEVICES = [
    ('typo', 'cdua', ValueError, "'cdua' is not a torch device"),
    ('empty', '', ValueError, "'' is not a torch device"),
    ('upper-case', 'CPU', ValueError, "'CPU' is not a torch device"),
    ('negative-index', 'cuda:-1', ValueError, 'not a torch device'),
    ('meta', 'meta', ValueError, 'meta'),
    ('int', 0, TypeError, 'device must be a str'),
    ('dtype', torch.float16, TypeError, 'device must be a str'),
    ('tensor', torch.ones(1), TypeError, 'device must be a str'),
]


@pytest.mark.parametrize('device, exc, match', [b[1:] for b in BAD_DEVICES],
                         ids=[b[0] for b in BAD_DEVICES])
def test_precision_support_bad_devices(device, exc, match):
    with pytest.raises(exc, match=match):
        precision_support(device)


def test_precision_support_cuda_index_out_of_range(monkeypatch):
    monkeypatch.setattr(caps, 'device_present', lambda kind: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    from fp16utils import _torch
    monkeypatch.setattr(_torch.probes, 'device_present', lambda kind: True)
    with pytest.raises(ValueError, match='cuda:7 does not exist; this machine has 2'):
        precision_support('cuda:7')


def test_precision_support_absent_device_is_unsupported_not_an_error():
    if torch.cuda.is_available():
        pytest.skip('a CUDA device is present here')
    assert precision_support('cuda:0') == {F16: 'unsupported', BF16: 'unsupported'}


@pytest.mark.parametrize('probe, exc, match', [
    ('fast', TypeError, 'probe must be callable'),
    (lambda *a: 'fast', ValueError, "answered .*'fast'"),
    (lambda *a: None, ValueError, 'answered'),
])
def test_precision_support_bad_probes(monkeypatch, probe, exc, match):
    monkeypatch.setattr(caps, 'cpu_isa_flags', lambda: frozenset())  # the table cannot tell
    with pytest.raises(exc, match=match):
        precision_support('cpu', probe=probe)


def test_precision_support_probe_that_raises_propagates_and_caches_nothing(monkeypatch):
    monkeypatch.setattr(caps, 'cpu_isa_flags', lambda: frozenset())
    monkeypatch.setattr(caps, '_speed_cache', {})

    def probe(*args):
        raise KeyError('boom')

    with pytest.raises(KeyError, match='boom'):
        precision_support('cpu', probe=probe)
    assert caps._speed_cache == {}


# ------------------------------------------------------------- dtype='auto'


@pytest.fixture
def nothing_native(monkeypatch):
    monkeypatch.setattr(caps, 'table_level', lambda device_type, dtype, index=None: 'emulated')


def test_auto_with_nothing_native_and_legacy_says_both_reasons(nothing_native):
    m = model()
    before = snapshot(m)
    with pytest.raises(ValueError, match="legacy backend.*float32.*dtype='auto': neither"):
        AmpOptimWrapper(torch.optim.SGD(m.parameters(), lr=0.1), dtype='auto',
                        backend='legacy', model=m)
    unchanged(m, before)


def test_auto_with_nothing_native_ignores_a_loss_scale_and_skips_nothing(nothing_native):
    m = nn.Linear(4, 2)
    wrapper = AmpOptimWrapper(torch.optim.SGD(m.parameters(), lr=0.1), dtype='AUTO',
                              loss_scale=512.)
    assert wrapper.dtype == F32 and wrapper.loss_scale == 1.0
    with wrapper.optim_context(m):
        out = m(torch.ones(1, 4))
    assert out.dtype == F32 and not torch.is_autocast_enabled()


def test_auto_with_an_empty_optimizer_asks_the_best_device(monkeypatch):
    asked = []
    monkeypatch.setattr(caps, 'table_level',
                        lambda device_type, dtype, index=None: asked.append(device_type)
                        or 'native')
    from fp16utils import _torch
    monkeypatch.setattr(_torch.caps, 'best_device_type', lambda: 'cpu')
    p = nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)
    opt.param_groups[0]['params'] = []
    try:
        wrapper = AmpOptimWrapper(opt, dtype='auto')
    except (ValueError, IndexError) as err:  # an empty optimizer may be refused elsewhere
        pytest.skip(f'an empty optimizer is refused before dtype: {err}')
    assert asked and set(asked) == {'cpu'} and wrapper.dtype == BF16


def test_auto_with_parameters_on_meta_is_refused():
    m = nn.Linear(2, 2, device='meta')
    with pytest.raises(ValueError, match="dtype='auto': the 'meta' device computes nothing"):
        AmpOptimWrapper(torch.optim.SGD(m.parameters(), lr=0.1), dtype='auto')


@pytest.mark.parametrize('dtype', ['Auto ', 'automatic', 'best'])
def test_auto_lookalikes_are_refused(dtype):
    with pytest.raises(ValueError, match='Unsupported dtype'):
        AmpOptimWrapper(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1), dtype=dtype)


def test_auto_on_a_plain_optim_wrapper_config_is_an_unknown_key():
    with pytest.raises(ValueError, match="unknown key.*dtype"):
        build_optim_wrapper(nn.Linear(1, 1), dict(type='OptimWrapper', dtype='auto',
                                                  optimizer=dict(type='SGD', lr=0.1)))


@pytest.mark.parametrize('dtype', ['Auto', 'AUTO', 'float32', torch.bfloat16])
def test_enable_amp_refuses_other_spellings(dtype):
    cfg = dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)))
    with pytest.raises(ValueError, match="'bfloat16' or 'auto'"):
        enable_amp(cfg, dtype)
    assert cfg == dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)))


def test_cli_dtype_auto_without_amp_and_a_bad_choice(tmp_path, capsys):
    src = tmp_path / 'old.py'
    src.write_text("optimizer = dict(type='SGD', lr=0.02)\n")
    assert main(['migrate', str(src), '--dtype', 'auto']) != 0
    assert '--dtype only applies with --amp' in capsys.readouterr().err
    assert main(['migrate', str(src), '--amp', '--dtype', 'best']) != 0
    assert "invalid choice: 'best'" in capsys.readouterr().err


# ----------------------------------------------------------- cache_enabled


@pytest.mark.parametrize('bad', ['False', 0, 1, None.__class__, [False]])
def test_cache_enabled_bad_values_change_nothing(bad):
    _caps.require(LOW, 'native', scaled=False)
    m = model()
    wrapper = AmpOptimWrapper(torch.optim.SGD(m.parameters(), lr=0.1), dtype=LOW,
                              fp32_modules='1')
    with pytest.raises(TypeError, match='cache_enabled must be None'):
        wrapper.optim_context(m, cache_enabled=bad)
    assert kept_fp32(m) == []  # the refused call applied nothing
    assert not torch.is_autocast_enabled() and torch.is_autocast_cache_enabled()


def test_cache_enabled_on_the_dict_is_still_per_entry():
    d = OptimWrapperDict(a=OptimWrapper(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1)))
    with pytest.raises(NotImplementedError):
        d.optim_context(nn.Linear(1, 1), cache_enabled=False)


def test_cache_enabled_false_nested_in_an_outer_autocast_is_restored():
    _caps.require(LOW, 'native', scaled=False)
    m = nn.Linear(4, 2)
    wrapper = AmpOptimWrapper(torch.optim.SGD(m.parameters(), lr=0.1), dtype=LOW)
    with torch.autocast('cpu', dtype=LOW):
        with wrapper.optim_context(m, cache_enabled=False):
            assert not torch.is_autocast_cache_enabled()
        assert torch.is_autocast_cache_enabled()
        assert m(torch.ones(1, 4)).dtype == LOW
