"""The ``fp16utils`` command's help, as a user reads it, and the options it documents."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap

import pytest

from fp16utils import migrate
from fp16utils.tools import cli
from fp16utils.tools.help import HELP

COMMANDS = sorted(HELP)


def _help(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        cli.main([*args, '--help'])
    assert stop.value.code == 0
    return out.getvalue()


def test_every_subcommand_has_help_text():
    subparsers = next(a for a in cli.build_parser()._actions if a.dest == 'command')
    assert sorted(subparsers.choices) == COMMANDS


@pytest.mark.parametrize('name', COMMANDS)
def test_subcommand_help_has_a_description_examples_and_exit_codes(name):
    text = _help(name)
    usage, _, rest = text.partition('\n\n')
    assert usage.startswith(f'usage: fp16utils {name}')
    description = rest.split('\n\n')[0]
    assert description.replace('\n', ' ') == HELP[name].description
    examples = re.search(r'^examples:\n((?:  .*\n)+)', text, re.M)
    assert examples, text
    for line in examples.group(1).splitlines():
        assert re.match(rf'  (?:[A-Z0-9_]+=\S+ )*fp16utils {name}\b', line), line
    codes = re.search(r'^exit codes:\n((?:  .*\n?)+)', text, re.M)
    assert codes, text
    numbers = re.findall(r'^  (\d+) ', codes.group(1), re.M)
    assert '0' in numbers or name in ('run', 'bench')  # those two pass on the child's code
    assert '2' in numbers and '130' in numbers
    assert max(len(line) for line in text.splitlines()) <= 79


@pytest.mark.parametrize('name', COMMANDS)
def test_every_example_parses(name):
    parser = cli.build_parser()
    text = HELP[name].epilog
    lines = re.findall(r'^  (?:[A-Z0-9_]+=\S+ )*fp16utils (.*?)(?:\s+#.*)?$', text, re.M)
    assert lines
    for line in lines:
        args = parser.parse_args(line.split())
        assert args.command == name


def test_main_help_lists_every_command_in_its_epilog():
    text = _help()
    listed = re.findall(r'^  (\w+) {2,}', text.split('commands in the order')[1], re.M)
    assert sorted(listed) == COMMANDS


def test_migrate_help_says_the_config_is_executed_and_when_dtype_is_ignored():
    text = ' '.join(_help('migrate').split())
    assert 'EXECUTED' in text and 'never migrate a config you do not trust' in text
    assert '--dtype is ignored' in text and '--plugin' in text


def test_bench_help_names_its_arguments_and_needs_a_checkout():
    text = _help('bench')
    assert 'rest' not in text and 'NAME' in text and 'ARGS' in text
    assert 'pip install -e .' in ' '.join(text.split())


def test_demo_help_documents_the_seed_and_the_warm_up():
    text = ' '.join(_help('demo').split())
    assert '--seed' in text and 'the same for every' in text
    assert 'warmed up untimed' in text


# -------------------------------------------------------------------- migrate --plugin


CONFIG_0X = textwrap.dedent('''\
    optimizer = dict(type='SGD', lr=0.1, momentum=0.9)
    optimizer_config = dict(grad_clip=dict(max_norm=35, norm_type=2))
    fp16 = dict(loss_scale=512.)
''')


def _migrate(tmp_path, *options):
    src = tmp_path / 'cfg.py'
    src.write_text(CONFIG_0X)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(['migrate', str(src), *options], out=out)
    return code, out.getvalue(), err.getvalue()


def test_migrate_plugin_writes_the_plugin_config(tmp_path):
    code, text, err = _migrate(tmp_path, '--plugin', '--codebase', 'mmdet')
    assert code == 0 and err == ''
    namespace: dict = {}
    exec(text, namespace)  # the written file loads as a config
    cfg = migrate.load_config(_write(tmp_path / 'out.py', text))
    assert cfg == {k: v for k, v in namespace.items() if not k.startswith('__')}
    assert cfg['custom_imports'] == dict(imports=['fp16utils.mmengine'],
                                         allow_failed_imports=False)
    expected = migrate.convert_config(migrate.load_config(tmp_path / 'cfg.py'), plugin=True)
    assert cfg == expected
    assert cfg['optim_wrapper']['type'] != 'AmpOptimWrapper'  # the plug-in's registered name


def test_migrate_without_plugin_has_no_custom_imports(tmp_path):
    code, text, _ = _migrate(tmp_path)
    assert code == 0 and 'custom_imports' not in text


def test_migrate_dtype_on_a_config_already_in_fp16_warns_and_is_not_applied(tmp_path):
    code, text, err = _migrate(tmp_path, '--amp', '--dtype', 'bfloat16')
    assert code == 0 and 'bfloat16' not in text
    assert "dtype='bfloat16' not applied" in err


def _write(path, text):
    path.write_text(text)
    return path


# -------------------------------------------------------------------- migrate from Python


def test_load_and_format_config_are_exported_and_round_trip(tmp_path):
    assert {'load_config', 'format_config'} <= set(migrate.__all__)
    src = _write(tmp_path / 'c.py', CONFIG_0X)
    converted = migrate.convert_config(migrate.load_config(src))
    out = _write(tmp_path / 'new.py', migrate.format_config(converted))
    assert migrate.load_config(out) == converted
