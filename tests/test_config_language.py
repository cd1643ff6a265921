"""``load_config`` reads mmcv's config language: ``{{ _base_.x }}`` references, the
predefined variables, ``_delete_``, ``.json`` and ``.yaml`` files (differential against
mmcv 1.7.2's ``Config.fromfile`` in tests/consumers/test_differential_config.py)."""

from __future__ import annotations

import json

import pytest

from fp16utils.migrate import convert_config
from fp16utils.migrate.config_files import format_config, load_config
from fp16utils.migrate.errors import CommandError


def write(path, text):
    path.write_text(text)
    return path


def test_a_base_reference_takes_the_value_of_the_bases(tmp_path):
    write(tmp_path / 'base.py', 'policies = [dict(type="A"), dict(type="B")]\n'
                                'model = dict(backbone=dict(depth=50), neck=None)\n'
                                '_dim_ = 256\n')
    cfg = load_config(write(tmp_path / 'c.py', (
        "_base_ = './base.py'\n"
        'pipeline = [dict(type="Aug", policies={{_base_.policies}})]\n'
        'depth = {{ _base_.model.backbone.depth }}\n'
        'dims = ({{_base_._dim_}}, {{_base_._dim_}})\n'
        'model = dict(backbone=dict(depth=101))\n')))
    assert cfg['pipeline'] == [dict(type='Aug', policies=[dict(type='A'), dict(type='B')])]
    assert cfg['depth'] == 50 and cfg['dims'] == (256, 256)
    assert cfg['model'] == dict(backbone=dict(depth=101), neck=None)
    assert '_dim_' not in cfg and '_base_' not in cfg


def test_a_reference_to_nothing_in_the_bases_names_it(tmp_path):
    write(tmp_path / 'base.py', 'a = 1\n')
    with pytest.raises(CommandError, match=r'\{\{ _base_\.b \}\} names nothing in its _base_'):
        load_config(write(tmp_path / 'c.py', "_base_ = 'base.py'\nx = {{_base_.b}}\n"))


def test_the_predefined_variables_name_the_file(tmp_path):
    cfg = load_config(write(tmp_path / 'cfg.name.py', (
        "root = '{{ fileDirname }}/data'\nname = '{{fileBasename}}'\n"
        "stem = '{{ fileBasenameNoExtension }}'\next = '{{ fileExtname }}'\n")))
    assert cfg == dict(root=f'{tmp_path.resolve()}/data', name='cfg.name.py',
                       stem='cfg.name', ext='.py')


def test_json_and_yaml_configs_and_bases(tmp_path):
    write(tmp_path / 'base.json', json.dumps(dict(optimizer=dict(type='SGD', lr=0.1),
                                                  lrs=[1, 2])))
    cfg = load_config(write(tmp_path / 'c.json', json.dumps(dict(
        _base_='base.json', optimizer=dict(lr=0.02), fp16=dict(loss_scale=512.0)))))
    assert cfg == dict(optimizer=dict(type='SGD', lr=0.02), lrs=[1, 2],
                       fp16=dict(loss_scale=512.0))
    ref = load_config(write(tmp_path / 'r.json', '{"_base_": "base.json", "x": {{_base_.lrs}}}'))
    assert ref['x'] == [1, 2]
    pytest.importorskip('yaml', reason='PyYAML is not installed (mmcv reads YAML with it)')
    cfg = load_config(write(tmp_path / 'c.yaml', "_base_: base.json\noptimizer:\n  lr: 0.5\n"))
    assert cfg['optimizer'] == dict(type='SGD', lr=0.5)


def test_a_yaml_config_without_pyyaml_says_what_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, 'yaml', None)  # as if PyYAML were not installed
    with pytest.raises(CommandError, match=r'needs PyYAML \(pip install pyyaml\)'):
        load_config(write(tmp_path / 'c.yml', 'a: 1\n'))


@pytest.mark.parametrize('name, text, needle', [
    ('c.json', '{"a": ', 'not valid JSON'),
    ('c.json', '[1, 2]', 'holds list, not a dict'),
    ('c.toml', 'a = 1', 'must be a .py, .json, .yaml or .yml file'),
])
def test_bad_non_python_configs_are_named(tmp_path, name, text, needle):
    with pytest.raises(CommandError, match=needle):
        load_config(write(tmp_path / name, text))


def test_a_referenced_config_converts_and_writes_back(tmp_path):
    write(tmp_path / 'base.py', 'scale = 512.\noptimizer = dict(type="SGD", lr=0.1)\n')
    cfg = load_config(write(tmp_path / 'c.py', (
        "_base_ = 'base.py'\n"
        'optimizer_config = dict(type="Fp16OptimizerHook", loss_scale={{_base_.scale}})\n')))
    new = convert_config(cfg)
    assert new['optim_wrapper']['loss_scale'] == 512.0
    out = write(tmp_path / 'out.py', format_config(new))
    assert load_config(out) == new


def test_a_deprecated_config_is_read_with_a_warning_naming_its_replacement(tmp_path):
    from fp16utils.migrate import MigrationWarning

    write(tmp_path / 'base.py', "_deprecation_ = dict(expected='new_base.py', "
                                "reference='https://example.org/pr/1')\na = 1\n")
    path = write(tmp_path / 'c.py', "_base_ = 'base.py'\nb = 2\n")
    with pytest.warns(MigrationWarning) as caught:
        cfg = load_config(path)
    assert cfg == dict(a=1, b=2)
    assert [str(w.message) for w in caught] == [
        f'the config file {(tmp_path / "base.py").resolve()} will be deprecated in the '
        'future. Please use new_base.py instead. More information can be found at '
        'https://example.org/pr/1']


def test_migrate_says_a_config_is_deprecated_and_still_converts_under_strict(tmp_path):
    import io
    import sys

    from fp16utils.tools.cli import main

    path = write(tmp_path / 'c.py', "_deprecation_ = dict(expected='d.py')\n"
                                    "optimizer = dict(type='SGD', lr=0.1)\n"
                                    "fp16 = dict(loss_scale=512.)\n")
    err = io.StringIO()
    out = io.StringIO()
    real = sys.stderr
    sys.stderr = err
    try:
        status = main(['migrate', str(path), '--strict'], out=out)
    finally:
        sys.stderr = real
    assert status == 0
    assert 'note: the config file' in err.getvalue() and 'Please use d.py instead.' in (
        err.getvalue())
    assert "loss_scale=512.0" in out.getvalue()
