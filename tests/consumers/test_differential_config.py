"""Differential: ``fp16utils.migrate``'s ``load_config`` against mmcv 1.7.2's
``Config.fromfile`` on the config language: ``{{ _base_.x }}`` references (nested,
repeated, inside lists and tuples), the predefined variables, ``_delete_``, several
bases, ``.json`` and ``.yaml`` files. Both read the same values; mmcv keeps ``_name``
variables in the config, which ``load_config`` leaves out (listed in
docs/reference/differences-mmcv.md)."""

from __future__ import annotations

import json

import _consumers
import pytest

_consumers.require()

from mmcv import Config  # noqa: E402

from fp16utils.migrate.config_files import load_config  # noqa: E402


def mmcv_reads(path):
    """What mmcv reads, without the ``_name`` variables that load_config leaves out."""
    cfg = Config.fromfile(str(path)).to_dict()
    return {k: v for k, v in cfg.items() if not k.startswith('_')}


CASES = {
    'references': {
        'base.py': ('policies = [dict(type="A", magnitude=9), dict(type="B")]\n'
                    'model = dict(backbone=dict(depth=50, out=(1, 2)), neck=None)\n'
                    '_dim_ = 256\n'),
        'c.py': ("_base_ = './base.py'\n"
                 'pipeline = [dict(type="Aug", policies={{_base_.policies}})]\n'
                 'depth = {{ _base_.model.backbone.depth }}\n'
                 'dims = ({{_base_._dim_}}, [{{_base_._dim_}}])\n'
                 'out = {{_base_.model.backbone.out}}\n'
                 'model = dict(backbone=dict(depth=101))\n'),
    },
    'predefined': {
        'c.py': ("root = '{{ fileDirname }}/data'\nname = '{{fileBasename}}'\n"
                 "stem = '{{ fileBasenameNoExtension }}'\next = '{{ fileExtname }}'\n"),
    },
    'delete and several bases': {
        'a.py': 'optimizer = dict(type="SGD", lr=0.1, momentum=0.9)\nfp16 = dict(x=1)\n',
        'b.py': 'optimizer_config = dict(grad_clip=dict(max_norm=35))\n',
        'c.py': ("_base_ = ['a.py', 'b.py']\n"
                 'optimizer = dict(_delete_=True, type="Adam", lr={{_base_.optimizer.lr}})\n'
                 'fp16 = dict(loss_scale=512.)\n'),
    },
    'json': {
        'base.json': json.dumps(dict(optimizer=dict(type='SGD', lr=0.1), steps=[8, 11])),
        'c.json': '{"_base_": "base.json", "optimizer": {"lr": 0.02}, "x": {{_base_.steps}}}',
    },
    'yaml': {
        'base.yaml': 'optimizer:\n  type: SGD\n  lr: 0.1\nsteps: [8, 11]\n',
        'c.yaml': '_base_: base.yaml\noptimizer:\n  lr: 0.5\nx: {{ _base_.steps }}\n',
    },
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_load_config_reads_what_mmcv_reads(tmp_path, case):
    if case == 'yaml':
        pytest.importorskip('yaml', reason='PyYAML is not installed')
    files = CASES[case]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    top = tmp_path / ('c.json' if case == 'json' else 'c.yaml' if case == 'yaml' else 'c.py')
    ours = load_config(top)
    assert ours == mmcv_reads(top)
    assert ours  # something was read


def test_difference_underscore_variables_are_left_out(tmp_path):
    (tmp_path / 'c.py').write_text('_dim_ = 256\nneck = dict(dim=_dim_)\n')
    assert Config.fromfile(str(tmp_path / 'c.py')).to_dict() == dict(
        _dim_=256, neck=dict(dim=256))
    assert load_config(tmp_path / 'c.py') == dict(neck=dict(dim=256))


def test_difference_a_dict_over_a_value_of_the_base_replaces_it(tmp_path):
    (tmp_path / 'base.py').write_text('fp16 = None\n')
    (tmp_path / 'c.py').write_text("_base_ = 'base.py'\nfp16 = dict(loss_scale=512.)\n")
    with pytest.raises(TypeError, match='_delete_=True'):
        Config.fromfile(str(tmp_path / 'c.py'))
    assert load_config(tmp_path / 'c.py') == dict(fp16=dict(loss_scale=512.0))


def test_a_deprecated_config_warns_as_mmcv_does(tmp_path):
    import warnings

    from fp16utils.migrate import MigrationWarning

    (tmp_path / 'c.py').write_text("_deprecation_ = dict(expected='new.py', "
                                   "reference='https://example.org/1')\na = 1\n")
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter('always')
        cfg = Config.fromfile(str(tmp_path / 'c.py')).to_dict()
    with pytest.warns(MigrationWarning) as ours:
        assert load_config(tmp_path / 'c.py') == cfg == dict(a=1)
    said = [str(w.message) for w in theirs if issubclass(w.category, DeprecationWarning)]
    assert [m[0].lower() + m[1:] for m in said] == [str(w.message) for w in ours]
