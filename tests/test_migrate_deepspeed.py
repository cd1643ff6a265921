"""DeepSpeed's fp16 names and its ``fp16`` block, converted by ``migrate`` to the policy's names.

The conversion is checked here on its own (stdlib only); the last tests check that the
runtime takes what the conversion writes (``AmpOptimWrapper``, ``Fp16OptimizerHook``).
"""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fp16utils.migrate import ConfigConversionError, convert_config, migrate_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'docs' / 'migration' / 'convert-config.md'
SGD = dict(type='SGD', lr=0.1)
#: DeepSpeed's fp16 block as its configuration page shows it.
BLOCK = dict(enabled=True, loss_scale=0, initial_scale_power=16, loss_scale_window=1000,
             hysteresis=2, consecutive_hysteresis=False, min_loss_scale=1)
CONVERTED = dict(init_scale=65536.0, growth_interval=1000, hysteresis=2,
                 consecutive_hysteresis=False, min_scale=1.0)


def migrate(faithful=False, codebase='mmdet', **keys):
    """migrate_config on an SGD config with ``keys``: (optim_wrapper, problems, notes)."""
    report = migrate_config(dict(optimizer=dict(SGD), **keys), codebase=codebase,
                            faithful=faithful)
    return report.config.get('optim_wrapper'), report.problems, report.notes


def nested(faithful=False, **scale):
    """``fp16=dict(loss_scale=dict(**scale))``: (the converted loss_scale, problems, notes)."""
    wrapper, problems, notes = migrate(faithful, fp16=dict(loss_scale=scale))
    return wrapper['loss_scale'], problems, notes


# ------------------------------------------------------------------ each name


@pytest.mark.parametrize('given, written', [
    (dict(initial_scale_power=12), dict(init_scale=4096.0)),
    (dict(initial_scale_power=16.0), dict(init_scale=65536.0)),  # a whole float, as JSON has
    (dict(initial_scale_power=-2), dict(init_scale=0.25)),
    (dict(loss_scale_window=500), dict(growth_interval=500)),
    (dict(loss_scale_window=500.0), dict(growth_interval=500)),
    (dict(min_loss_scale=2), dict(min_scale=2.0)),
    (dict(min_loss_scale=0.5), dict(min_scale=0.5)),
    (dict(hysteresis=3), dict(hysteresis=3)),
    (dict(consecutive_hysteresis=True), dict(consecutive_hysteresis=True)),
    (dict(raise_error_at_min_scale=True), dict(at_min_scale='raise')),
    (dict(raise_error_at_min_scale=False), dict(at_min_scale='continue')),
])
@pytest.mark.parametrize('place', ['fp16', 'optimizer_config', 'runner'])
def test_each_deepspeed_name_is_written_in_ours(given, written, place):
    # The window and hysteresis are given so that no default is in question here.
    scale = dict(dict(loss_scale_window=1000, hysteresis=2), **given)
    if place == 'fp16':
        keys = dict(fp16=dict(loss_scale=scale))
    elif place == 'optimizer_config':
        keys = dict(optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=scale))
    else:
        keys = dict(runner=dict(type='IterBasedRunner', max_iters=10, fp16_loss_scaler=scale))
    wrapper, problems, _ = migrate(**keys)
    assert problems == []
    assert wrapper['type'] == 'AmpOptimWrapper'
    loss_scale = wrapper['loss_scale']
    for key, value in written.items():
        assert loss_scale[key] == value and type(loss_scale[key]) is type(value)
    assert not set(loss_scale) & {'initial_scale_power', 'loss_scale_window', 'min_loss_scale',
                                  'raise_error_at_min_scale'}


def test_the_written_dict_follows_the_documented_order():
    scale, problems, notes = nested(min_loss_scale=1, raise_error_at_min_scale=False,
                                    consecutive_hysteresis=True, hysteresis=2,
                                    loss_scale_window=100, initial_scale_power=10)
    assert problems == [] and notes == []
    assert list(scale.items()) == [('init_scale', 1024.0), ('growth_interval', 100),
                                   ('hysteresis', 2), ('consecutive_hysteresis', True),
                                   ('min_scale', 1.0), ('at_min_scale', 'continue')]


def test_the_policy_names_are_kept_and_keep_our_defaults():
    given = dict(init_scale=1024.0, growth_interval=50, hysteresis=2,
                 consecutive_hysteresis=True, min_scale=0.5, max_scale=2.0**24,
                 at_min_scale='warn')
    scale, problems, notes = nested(**given)
    assert scale == given and list(scale) == list(given)
    assert problems == [] and notes == []  # no DeepSpeed name: no DeepSpeed default said


def test_mmcv_names_and_the_policy_go_together():
    scale, problems, _ = nested(mode='dynamic', scale_factor=4.0, scale_window=100,
                                init_scale=256, hysteresis=2, min_scale=4.0)
    assert problems == []
    assert scale == dict(init_scale=256, growth_factor=4.0, backoff_factor=0.25,
                         growth_interval=100, hysteresis=2, min_scale=4.0)


# ------------------------------------------------------------------ DeepSpeed's fp16 block


#: The runtime keys that make the conversion write val_cfg and test_cfg.
LOOPS = dict(runner=dict(type='EpochBasedRunner', max_epochs=2), evaluation=dict(interval=1))


def fp16_lines(lines):
    """The lines of a report that are not about the runtime keys of :data:`LOOPS`."""
    return [line for line in lines if not line.startswith(('evaluation', 'runner'))]


def test_deepspeeds_fp16_block_becomes_the_wrappers_loss_scale():
    report = migrate_config(dict(optimizer=dict(SGD), fp16=dict(BLOCK), **LOOPS),
                            codebase='mmdet')
    wrapper = report.config['optim_wrapper']
    assert wrapper == dict(type='AmpOptimWrapper', optimizer=SGD, loss_scale=CONVERTED)
    assert 'fp16' not in report.config
    assert report.config['val_cfg']['fp16'] is True  # mmdet's test script read fp16
    assert fp16_lines(report.problems) == [] and fp16_lines(report.notes) == []


@pytest.mark.parametrize('dynamic', [0, 0.0, 'dynamic'])
def test_a_zero_or_dynamic_loss_scale_in_the_block_is_the_dynamic_scale(dynamic):
    wrapper, problems, _ = migrate(fp16=dict(BLOCK, loss_scale=dynamic))
    assert problems == [] and wrapper['loss_scale'] == CONVERTED


def test_a_nonzero_loss_scale_in_the_block_is_a_static_scale():
    wrapper, problems, _ = migrate(fp16=dict(enabled=True, loss_scale=128))
    assert problems == [] and wrapper['loss_scale'] == 128.0
    wrapper, problems, _ = migrate(fp16=dict(BLOCK, loss_scale=128))
    assert wrapper['loss_scale'] == 128.0
    assert len(problems) == 1 and problems[0].startswith('fp16: initial_scale_power, ')
    assert 'static' in problems[0] and 'dropped' in problems[0]


def test_enabled_false_keeps_float32_with_a_note():
    report = migrate_config(dict(optimizer=dict(SGD), fp16=dict(BLOCK, enabled=False),
                                 **LOOPS), codebase='mmdet')
    assert report.config['optim_wrapper'] == dict(type='OptimWrapper', optimizer=SGD)
    assert report.config['val_cfg'] == dict(type='ValLoop')  # no half-precision testing
    assert report.config['test_cfg'] == dict(type='TestLoop')
    assert fp16_lines(report.problems) == []
    notes = fp16_lines(report.notes)
    assert len(notes) == 1 and notes[0].startswith('fp16: enabled=False')


def test_enabled_false_with_an_fp16_hook_still_trains_in_fp16():
    wrapper, problems, notes = migrate(
        fp16=dict(enabled=False),
        optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=64.0))
    assert wrapper['type'] == 'AmpOptimWrapper' and wrapper['loss_scale'] == 64.0
    assert problems == [] and 'unless optimizer_config names an fp16 hook' in notes[0]


def test_a_block_without_enabled_is_read_as_on_with_a_note():
    block = {k: v for k, v in BLOCK.items() if k != 'enabled'}
    wrapper, problems, notes = migrate(fp16=block)
    assert wrapper['type'] == 'AmpOptimWrapper' and wrapper['loss_scale'] == CONVERTED
    assert problems == []
    assert len(notes) == 1 and 'enabled defaults to False' in notes[0]


def test_enabled_must_be_a_bool():
    wrapper, problems, _ = migrate(fp16=dict(BLOCK, enabled='auto'))
    assert wrapper['type'] == 'AmpOptimWrapper' and wrapper['loss_scale'] == CONVERTED
    assert len(problems) == 1 and problems[0].startswith("fp16.enabled: expected True or False")


def test_a_codebase_whose_training_ignores_fp16_ignores_the_block_too():
    wrapper, problems, notes = migrate(codebase='mmseg', fp16=dict(enabled=True))
    assert wrapper == dict(type='OptimWrapper', optimizer=SGD)
    assert problems == [] and len(notes) == 1 and notes[0].startswith('fp16: mmseg 0.x')


@pytest.mark.parametrize('key, value, fragment', [
    ('auto_cast', True, 'torch.autocast'),
    ('fp16_master_weights_and_grads', True, 'float32'),
])
def test_block_keys_without_an_equivalent_are_reported_unless_false(key, value, fragment):
    wrapper, problems, _ = migrate(fp16=dict(BLOCK, **{key: False}))
    assert problems == [] and wrapper['loss_scale'] == CONVERTED
    wrapper, problems, _ = migrate(fp16=dict(BLOCK, **{key: value}))
    assert wrapper['loss_scale'] == CONVERTED
    assert len(problems) == 1 and problems[0].startswith(f'fp16.{key}=True has no equivalent')
    assert fragment in problems[0]


def test_block_keys_next_to_a_loss_scale_dict_are_reported():
    wrapper, problems, _ = migrate(fp16=dict(enabled=True, hysteresis=4,
                                             loss_scale=dict(initial_scale_power=8)))
    assert wrapper['loss_scale']['init_scale'] == 256.0 and 'hysteresis' not in \
        wrapper['loss_scale']
    assert len(problems) == 1 and problems[0].startswith('fp16: hysteresis next to loss_scale')


def test_a_misspelt_block_key_is_reported_with_the_name_meant():
    wrapper, problems, _ = migrate(fp16=dict(BLOCK, initial_scale_pow=3))
    assert wrapper['loss_scale'] == CONVERTED
    assert len(problems) == 1
    assert "'initial_scale_pow' (did you mean 'initial_scale_power'?)" in problems[0]


# ------------------------------------------------------------------ defaults that differ


def test_left_out_keys_whose_deepspeed_default_differs_get_a_note():
    wrapper, problems, notes = migrate(fp16=dict(enabled=True))
    assert wrapper['loss_scale'] == 'dynamic'  # GradScaler's defaults, as written
    assert problems == [] and len(notes) == 1
    assert 'loss_scale_window: DeepSpeed 1000, here 2000' in notes[0]
    assert 'hysteresis: DeepSpeed 2, here 1' in notes[0]
    assert 'add growth_interval=1000, hysteresis=2' in notes[0] and '--faithful' in notes[0]
    assert notes[0].endswith('see docs/migration/convert-config.md#deepspeed')


def test_faithful_writes_deepspeeds_defaults_for_the_left_out_keys():
    wrapper, problems, notes = migrate(faithful=True, fp16=dict(enabled=True))
    assert wrapper['loss_scale'] == dict(growth_interval=1000, hysteresis=2)
    assert problems == [] and len(notes) == 1 and '(--faithful)' in notes[0]
    scale, _, notes = nested(faithful=True, initial_scale_power=12, hysteresis=3)
    assert scale == dict(init_scale=4096.0, growth_interval=1000, hysteresis=3)
    assert 'hysteresis' not in notes[0].split('(')[1]  # only the window was written


def test_only_the_left_out_key_is_named():
    scale, _, notes = nested(initial_scale_power=12, hysteresis=3)
    assert scale == dict(init_scale=4096.0, hysteresis=3)
    assert len(notes) == 1 and 'loss_scale_window' in notes[0]
    assert 'hysteresis: DeepSpeed' not in notes[0] and 'add growth_interval=1000 ' in notes[0]


def test_nothing_left_out_nothing_said_faithful_or_not():
    for faithful in (False, True):
        scale, problems, notes = nested(faithful, initial_scale_power=12,
                                        loss_scale_window=10, hysteresis=1)
        assert scale == dict(init_scale=4096.0, growth_interval=10, hysteresis=1)
        assert problems == [] and notes == []


# ------------------------------------------------------------------ conflicts and errors


@pytest.mark.parametrize('theirs, ours', [
    (dict(initial_scale_power=10), dict(init_scale=512.0)),
    (dict(loss_scale_window=100), dict(growth_interval=200)),
    (dict(loss_scale_window=100), dict(scale_window=200)),
    (dict(min_loss_scale=2), dict(min_scale=4.0)),
    (dict(raise_error_at_min_scale=True), dict(at_min_scale='warn')),
])
def test_two_names_for_one_setting_are_a_problem_and_ours_is_kept(theirs, ours):
    scale, problems, _ = nested(**theirs, **ours)
    ((their_key, _),), ((our_key, our_value),) = theirs.items(), ours.items()
    assert len(problems) == 1, problems
    assert problems[0].startswith(f'fp16.loss_scale: {their_key} (DeepSpeed) and {our_key} '
                                  'name the same setting')
    assert their_key not in scale
    kept = 'growth_interval' if our_key == 'scale_window' else our_key
    assert scale[kept] == our_value


#: DeepSpeed's keys with a value of the wrong kind (in a loss_scale dict or the fp16 block).
DEEPSPEED_ERRORS = [
    ('initial_scale_power', '16'), ('initial_scale_power', 16.5), ('initial_scale_power', 200),
    ('initial_scale_power', True), ('initial_scale_power', None),
    ('loss_scale_window', 0), ('loss_scale_window', 'x'), ('loss_scale_window', 2.5),
    ('min_loss_scale', 0), ('min_loss_scale', -1), ('min_loss_scale', math.inf),
    ('raise_error_at_min_scale', 'yes'), ('raise_error_at_min_scale', 1),
    ('hysteresis', 0), ('hysteresis', True), ('hysteresis', 1.5),
    ('consecutive_hysteresis', 1),
]
#: Our keys with a value of the wrong kind (a loss_scale dict only).
POLICY_ERRORS = [('at_min_scale', 'stop'), ('min_scale', 0.0), ('max_scale', math.inf),
                 ('max_scale', '2**24')]


@pytest.mark.parametrize('key, value', DEEPSPEED_ERRORS + POLICY_ERRORS)
def test_a_value_of_the_wrong_kind_is_a_problem_naming_the_key(key, value):
    wrapper, problems, _ = migrate(fp16=dict(loss_scale={key: value}))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f'fp16.loss_scale.{key}: expected ')
    assert 'kept as is' in problems[0]
    assert wrapper['loss_scale'][key] is value  # kept as it was given


@pytest.mark.parametrize('key, value', DEEPSPEED_ERRORS)
def test_a_value_of_the_wrong_kind_in_the_block_is_a_problem_naming_the_key(key, value):
    wrapper, problems, _ = migrate(fp16=dict(enabled=True, **{key: value}))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f'fp16.{key}: expected ') and 'kept as is' in problems[0]
    assert wrapper['loss_scale'][key] is value


def test_an_unknown_key_is_a_problem_naming_it():
    scale, problems, _ = nested(initial_scale_power=8, hysteresys=2)
    assert scale == dict(init_scale=256.0, hysteresys=2)
    assert len(problems) == 1
    assert problems[0].startswith('fp16.loss_scale.hysteresys: not an argument')
    assert 'hysteresis' in problems[0]  # the policy's names are listed


def test_a_floor_above_the_ceiling_is_a_problem():
    scale, problems, _ = nested(min_loss_scale=64, max_scale=16.0)
    assert scale == dict(min_scale=64.0, max_scale=16.0)
    assert len(problems) == 1 and 'min_scale=64.0 is above max_scale=16.0' in problems[0]


def test_a_static_mmcv_dict_drops_the_policy_with_a_problem():
    scale, problems, _ = nested(mode='static', initial_scale_power=8, hysteresis=2)
    assert scale == 256.0
    assert len(problems) == 1 and "hysteresis: ignored with mode='static'" in problems[0]


def test_two_places_that_disagree_are_reported():
    wrapper, problems, _ = migrate(
        fp16=dict(BLOCK),
        optimizer_config=dict(type='Fp16OptimizerHook', loss_scale=dict(initial_scale_power=8)))
    assert wrapper['loss_scale'] == CONVERTED
    assert len(problems) == 1
    assert problems[0].startswith('optimizer_config.loss_scale: ') and 'differs from fp16 ' \
        in problems[0]


def test_strict_fails_naming_the_key_and_the_input_is_not_changed():
    cfg = dict(optimizer=dict(SGD), fp16=dict(BLOCK, min_scale=1.0))
    before = copy.deepcopy(cfg)
    with pytest.raises(ConfigConversionError) as info:
        convert_config(cfg, strict=True, codebase='mmdet')
    assert len(info.value.problems) == 1 and "fp16 got the unknown key 'min_scale'" in \
        info.value.problems[0]
    assert cfg == before
    nested_cfg = dict(optimizer=dict(SGD), fp16=dict(loss_scale=dict(initial_scale_power=8,
                                                                     init_scale=4.0)))
    with pytest.raises(ConfigConversionError, match='initial_scale_power'):
        convert_config(nested_cfg, strict=True, codebase='mmdet')


def test_every_section_a_message_points_to_exists():
    ids = set(re.findall(r'\{#([\w-]+)\}', PAGE.read_text(encoding='utf-8')))
    source = ''.join((ROOT / 'fp16utils' / 'migrate' / name).read_text(encoding='utf-8')
                     for name in ('_deepspeed_keys.py', '_legacy_keys.py', '_loss_scale.py'))
    used = set(re.findall(r'convert-config\.md#([\w-]+)', source))
    assert 'deepspeed' in used and used <= ids, used - ids


# ------------------------------------------------------------------ the command


def _run(*args, cwd):
    """``fp16utils migrate ARGS`` run as a user runs it (this checkout first on the path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    return subprocess.run([sys.executable, '-m', 'fp16utils', 'migrate', *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_command_converts_a_config_with_deepspeeds_block(tmp_path):
    config = tmp_path / 'ds_fp16.py'
    config.write_text("optimizer = dict(type='AdamW', lr=1e-4)\n"
                      'fp16 = dict(enabled=True, loss_scale=0, initial_scale_power=16)\n')
    proc = _run(str(config), '--codebase', 'mmdet', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    converted: dict = {}
    exec(compile(proc.stdout, 'converted', 'exec'), converted)
    assert converted['optim_wrapper'] == dict(
        type='AmpOptimWrapper', optimizer=dict(type='AdamW', lr=1e-4),
        loss_scale=dict(init_scale=65536.0))
    notes = [line for line in proc.stderr.splitlines() if ': note: ' in line]
    assert len(notes) == 1 and 'loss_scale_window: DeepSpeed 1000, here 2000' in notes[0]
    assert 'warning:' not in proc.stderr

    proc = _run(str(config), '--codebase', 'mmdet', '--faithful', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    converted = {}
    exec(compile(proc.stdout, 'converted', 'exec'), converted)
    assert converted['optim_wrapper']['loss_scale'] == dict(
        init_scale=65536.0, growth_interval=1000, hysteresis=2)


def test_the_command_with_strict_fails_on_two_names_for_one_setting(tmp_path):
    config = tmp_path / 'ds_conflict.py'
    config.write_text("optimizer = dict(type='SGD', lr=0.1)\n"
                      'fp16 = dict(loss_scale=dict(loss_scale_window=100, growth_interval=200))\n')
    out = tmp_path / 'new.py'
    proc = _run(str(config), '--codebase', 'mmdet', '--strict', '-o', str(out), cwd=tmp_path)
    assert proc.returncode == 1 and not out.exists()
    warnings = [line for line in proc.stderr.splitlines() if ': warning: ' in line]
    assert len(warnings) == 1 and 'loss_scale_window (DeepSpeed) and growth_interval' in \
        warnings[0]


# ------------------------------------------------------------------ the runtime takes it
#
# These need the runtime's loss-scale policy (fp16utils/_args/policy.py: the wrappers and
# hooks take hysteresis, min_scale, max_scale, at_min_scale, consecutive_hysteresis).


def test_the_written_order_names_every_policy_key_the_runtime_takes():
    from fp16utils._args.policy import DEEPSPEED_NAMES, POLICY_KEYS
    from fp16utils.migrate._deepspeed_keys import BLOCK_KEYS, POLICY_ARGS

    assert sorted(POLICY_ARGS) == sorted(POLICY_KEYS)
    assert set(DEEPSPEED_NAMES) < set(BLOCK_KEYS)


@pytest.mark.parametrize('scale, needle', [
    (dict(initial_scale_power=-2, min_loss_scale=1), 'is below min_scale=1.0'),
    (dict(initial_scale_power=20, max_scale=1024.0), 'is above max_scale=1024.0'),
])
def test_a_policy_the_wrappers_would_refuse_is_reported_by_the_conversion(scale, needle):
    """The policy is read with the scale as the wrappers read it: refused there, told here."""
    converted, problems, _ = nested(**scale)
    assert len(problems) == 1 and needle in problems[0], problems
    assert problems[0].startswith('fp16.loss_scale: ')
    from fp16utils._args.spec import parse_loss_scale

    with pytest.raises(ValueError, match=re.escape(needle)):
        parse_loss_scale(converted, 'AmpOptimWrapper')


def _converted_block_scale():
    wrapper, problems, _ = migrate(fp16=dict(BLOCK))
    assert problems == []
    return wrapper['loss_scale']


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_amp_optim_wrapper_takes_the_converted_loss_scale(backend):
    import _caps  # tests/ is on sys.path: see conftest.py
    import _runner as R
    import torch

    from fp16utils import AmpOptimWrapper

    _caps.require(torch.float16, 'native' if backend == 'native' else None)
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=_converted_block_scale(),
                              backend=backend, model=model)
    assert wrapper.loss_scale == 65536.0

    def step(batch):
        with wrapper.optim_context(model):
            out = model(batch[0])
        wrapper.update_params((out.float() - batch[1]).pow(2).mean())

    step(R.make_data(1)[0])
    before = R.snapshot(model, optimizer)
    step(R.overflow_batch())  # hysteresis=2: skipped, the scale holds
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert (wrapper.skipped_steps, wrapper.loss_scale) == (1, 65536.0)
    step(R.overflow_batch())  # the second overflow in a row backs off
    assert (wrapper.skipped_steps, wrapper.loss_scale) == (2, 32768.0)


def test_fp16_optimizer_hook_takes_the_converted_loss_scale():
    from fp16utils import Fp16OptimizerHook

    scale = migrate(optimizer_config=dict(
        type='Fp16OptimizerHook', loss_scale=dict(initial_scale_power=12, hysteresis=2,
                                                  loss_scale_window=100,
                                                  raise_error_at_min_scale=True)))[0]['loss_scale']
    assert scale == dict(init_scale=4096.0, growth_interval=100, hysteresis=2,
                         at_min_scale='raise')
    hook = Fp16OptimizerHook(loss_scale=scale, backend='native')
    assert hook.loss_scale == 4096.0
