"""The reference pages say what the code has: every public name, every subcommand and
option, every config key with its default, and every test a difference names.

The pages: docs/reference/api/*.md (generated from the docstrings by ``::: name``
lines), docs/reference/cli.md, docs/reference/config-keys.md,
docs/reference/differences-mmcv.md, and the home page and README.md (their example's
printed output, their links).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import re
from pathlib import Path

import pytest

import fp16utils

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
API = DOCS / 'reference' / 'api'
_DIRECTIVE = re.compile(r'^::: ([\w.]+)\s*$', re.M)


def _directives() -> dict:
    """Every ``::: name`` line of the API pages: name -> page."""
    found: dict = {}
    for page in sorted(API.glob('*.md')):
        for name in _DIRECTIVE.findall(page.read_text()):
            assert name not in found, f'{name} is documented twice ({found.get(name)}, {page})'
            found[name] = page.name
    return found


def _mmengine_all() -> list:
    """fp16utils.mmengine's ``__all__``, read without importing mmengine."""
    tree = ast.parse(ROOT.joinpath('fp16utils', 'mmengine.py').read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, 'id', '') == '__all__' for t in n.targets))
    return ast.literal_eval(node.value)


# ---------------------------------------------------------------------------- the API


def test_every_public_name_has_its_entry_on_an_api_page():
    documented = _directives()
    assert len(fp16utils.__all__) == 47
    missing = [name for name in fp16utils.__all__ if f'fp16utils.{name}' not in documented]
    assert missing == []
    plugin = _mmengine_all()
    assert len(plugin) == 7
    assert [n for n in plugin if f'fp16utils.mmengine.{n}' not in documented] == []
    migrate = importlib.import_module('fp16utils.migrate')
    assert [n for n in migrate.__all__ if f'fp16utils.{n}' not in documented
            and f'fp16utils.migrate.{n}' not in documented] == []


def test_every_documented_name_is_a_public_name_that_exists():
    plugin = set(_mmengine_all())
    for name in _directives():
        parts = name.split('.')
        if parts[:2] == ['fp16utils', 'mmengine']:
            assert len(parts) == 2 or parts[2] in plugin, name
            continue
        obj = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
        assert not any(p.startswith('_') and not p.startswith('__') for p in parts), name


def test_the_api_index_lists_every_name_with_a_link_to_its_entry():
    index = (API / 'index.md').read_text()
    links = dict(re.findall(r'^\| \[`([\w.]+)`\]\[([\w.]+)\] \| \S', index, re.M))
    documented = _directives()
    assert set(links.values()) == set(documented) - {'fp16utils.mmengine'}
    for shown, target in links.items():
        assert target.endswith(f'.{shown}'), (shown, target)


def test_the_api_index_sections_are_the_api_pages():
    index = (API / 'index.md').read_text()
    sections = re.findall(r'^## \[[^\]]+\]\(([\w-]+\.md)\)$', index, re.M)
    assert sorted(sections) == sorted(p.name for p in API.glob('*.md') if p.name != 'index.md')


def test_help_shows_the_loss_scale_default_not_an_object_address():
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        help(fp16utils.AmpOptimWrapper)
    assert 'object at 0x' not in text.getvalue()
    assert "<default: 'dynamic' for float16" in text.getvalue()


def _griffe_extension():
    spec = importlib.util.spec_from_file_location('_griffe_fp16utils',
                                                  DOCS / '_griffe_fp16utils.py')
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as err:
        pytest.skip(f'the docs tools are not installed: {err}')
    return module


def test_the_site_renders_roles_as_links_or_code_and_examples_as_code():
    ext = _griffe_extension()
    targets = ext.documented()
    assert targets['OptimWrapper'] == 'fp16utils.OptimWrapper'
    text = ('Like :class:`OptimWrapper`; see :func:`~fp16utils.debug.find_overflow`, '
            ':meth:`optim_context` and :mod:`fp16utils.optim.constructor`.\n\n'
            '    Example:\n        >>> 1\n        1\n')
    assert ext.rewrite(text, targets) == (
        'Like [`OptimWrapper`][fp16utils.OptimWrapper]; see '
        '[`find_overflow`][fp16utils.find_overflow], `optim_context` and '
        '`fp16utils.optim.constructor`.\n\n    Examples:\n        >>> 1\n        1\n')


def test_the_site_shows_a_sentinel_default_as_help_does():
    from fp16utils.optim import amp

    ext = _griffe_extension()
    source = Path(amp.__file__).read_text()
    assert ext.sentinel_repr(source, '_UNSET') == repr(amp._UNSET)
    assert ext.sentinel_repr(source, '_Tensor') is None  # a name, not a sentinel object
    assert ext.sentinel_repr(source, '_NO_SUCH_NAME') is None


def test_the_site_shows_mmcv_defaults_as_their_value():
    import inspect

    from fp16utils import Fp16OptimizerHook, LossScaler
    from fp16utils._args import spec

    ext = _griffe_extension()
    source = ext.DEFAULTS_MODULE.read_text()
    assert ext.constant_source(source, 'MMCV_INIT_SCALE') == '2**32'
    assert ext.constant_source(source, 'MMCV_LOSS_SCALE') == '512.0'
    assert ext.constant_source(source, 'MMCV_DYNAMIC') is None  # not a literal
    assert ext.constant_source('N = 2**32\nM = f()\n', 'N') == '2**32'
    # The signatures name the constants, whose values are mmcv's.
    assert inspect.signature(LossScaler).parameters['init_scale'].default == 2**32
    assert inspect.signature(Fp16OptimizerHook).parameters['loss_scale'].default == 512.0
    assert (spec.MMCV_INIT_SCALE, spec.MMCV_LOSS_SCALE) == (2**32, 512.0)


# --------------------------------------------------------------------- the command line


def _sections(page: Path) -> dict:
    """``## title`` -> the text under it, for a page."""
    parts = re.split(r'^## (.+)$', page.read_text(), flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def _subcommands() -> dict:
    from fp16utils.tools.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == '_SubParsersAction')
    return dict(action.choices)


def test_the_cli_page_has_a_section_per_subcommand_with_every_option():
    sections = _sections(DOCS / 'reference' / 'cli.md')
    commands = _subcommands()
    assert sorted(commands) == ['bench', 'demo', 'doctor', 'env', 'migrate', 'run', 'scan']
    for name, sub in commands.items():
        assert name in sections, f'cli.md has no "## {name}" section'
        text = sections[name]
        for action in sub._actions:
            if action.option_strings:
                for option in action.option_strings:
                    if option not in ('-h', '--help'):
                        assert f'`{option}' in text, f'{name}: {option} is not documented'
            else:
                shown = action.metavar or action.dest.upper()
                assert f'`{shown}`' in text, f'{name}: {shown} is not documented'
        assert 'Exit codes' in text, name


def test_the_cli_page_gives_each_subcommands_exit_codes_as_its_help_does():
    from fp16utils.tools.help import HELP

    sections = _sections(DOCS / 'reference' / 'cli.md')
    for name, text in HELP.items():
        codes = re.findall(r'^  (\d+)  ', text.epilog, re.M)
        exit_codes = sections[name].split('Exit codes', 1)[1]
        for code in codes:
            if code != '130':  # interrupted: in the table of the whole command
                assert re.search(rf'\b{code}\b', exit_codes), (name, code)
    assert '| 130 |' in (DOCS / 'reference' / 'cli.md').read_text()


def test_the_cli_page_documents_the_top_level_options():
    from fp16utils.tools.cli import build_parser

    page = (DOCS / 'reference' / 'cli.md').read_text()
    for action in build_parser()._actions:
        for option in action.option_strings:
            assert f'`{option}' in page or f'{option}`' in page, option


# ------------------------------------------------------------------------ config keys


def _key_table(section: str) -> dict:
    """``| `key` | default | what |`` rows of the first table in ``section``: key -> default."""
    table = section.split('| key | default | what it does |', 1)[1].split('\n\n', 1)[0]
    rows = re.findall(r'^\| `([\w]+)` \| ([^|]*) \|', table, re.M)
    assert rows, section[:80]
    return {key: default.strip() for key, default in rows}


def _config_sections() -> dict:
    text = (DOCS / 'reference' / 'config-keys.md').read_text()
    parts = re.split(r'^#{2,3} .*\{#([\w-]+)\}$', text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _parameters(obj) -> dict:
    return {name: p.default for name, p in inspect.signature(obj).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _check_defaults(keys: dict, parameters: dict) -> None:
    for name, default in parameters.items():
        if name in keys and default is not inspect.Parameter.empty and (
                default is None or isinstance(default, (bool, int, float, str))):
            assert f'`{default!r}`' in keys[name], (name, default, keys[name])


def test_the_hook_keys_are_the_hooks_arguments_with_their_defaults():
    keys = _key_table(_config_sections()['optimizer-config'])
    hook = _parameters(fp16utils.Fp16OptimizerHook)
    cumulative = _parameters(fp16utils.GradientCumulativeFp16OptimizerHook)
    assert set(keys) == {'type'} | set(hook) | set(cumulative)
    _check_defaults(keys, {**hook, **cumulative})


def test_the_fp16_keys_are_hook_arguments():
    keys = _key_table(_config_sections()['fp16'])
    hook = _parameters(fp16utils.Fp16OptimizerHook)
    assert set(keys) <= set(hook)
    _check_defaults(keys, hook)


def test_the_optim_wrapper_keys_are_what_the_builder_and_the_wrapper_take():
    from fp16utils.optim import builder

    keys = _key_table(_config_sections()['optim-wrapper'])
    wrapper = _parameters(fp16utils.AmpOptimWrapper)
    assert set(keys) == {'constructor', *builder._COMMON_KEYS, *builder._AMP_KEYS}
    assert set(keys) == set(wrapper) - {'model'} | {'type', 'paramwise_cfg', 'constructor'}
    assert set(_parameters(fp16utils.OptimWrapper)) <= set(keys)
    # optimizer is None in the signature only for MMEngine's argument order: required.
    _check_defaults(keys, {k: v for k, v in wrapper.items()
                           if k not in ('loss_scale', 'optimizer')})
    assert keys['optimizer'] == '(required)'


def test_the_loss_scale_keys_are_the_scaler_arguments_of_both_vocabularies():
    from fp16utils._args import policy as _policy
    from fp16utils._args import spec as _spec

    keys = _key_table(_config_sections()['loss-scale'])
    assert set(keys) == (set(_spec.GRAD_SCALER_ARGS) | set(_spec.LOSS_SCALER_ARGS)
                         | set(_policy.POLICY_KEYS) | set(_policy.DEEPSPEED_NAMES))
    for name, default in _policy.DEFAULT_POLICY._asdict().items():
        assert keys[name].startswith(f'`{default!r}`'), (name, keys[name])
    for theirs in _policy.DEEPSPEED_NAMES:
        assert keys[theirs] == "(DeepSpeed's)", theirs
    torch_default, mmcv_default = _spec.TORCH_DYNAMIC, _spec.MMCV_DYNAMIC
    for name, mmcv_name in (('init_scale', None), ('growth_interval', 'scale_window'),
                            ('growth_factor', 'scale_factor')):
        cell = keys[name]
        assert f'`{getattr(torch_default, name)!r}`' in cell, (name, cell)
        if getattr(mmcv_default, name) != getattr(torch_default, name):
            assert f'`{getattr(mmcv_default, name)!r}`' in cell, (name, cell)
        if mmcv_name:
            assert keys[mmcv_name] == f'as `{name}`'
    assert f'`{torch_default.backoff_factor!r}`' in keys['backoff_factor']
    assert keys['mode'] == f"`{_parameters(fp16utils.LossScaler)['mode']!r}`"
    assert keys['enabled'] == '`True`' and torch_default.enabled is True


def test_the_clip_grad_keys_are_what_each_kind_of_clipping_takes():
    from fp16utils._args.spec import parse_clip_grad

    keys = _key_table(_config_sections()['clip-grad'])
    allowed = set()
    for kind, cfg in (('norm', dict(max_norm=1.0)), ('value', dict(clip_value=1.0))):
        with pytest.raises(ValueError) as info:
            parse_clip_grad(dict(cfg, type=kind, nope=1), 'test')
        allowed |= set(ast.literal_eval(re.search(r'takes (\[.*?\])', str(info.value)).group(1)))
    assert set(keys) == allowed | {'type'}


def test_the_guard_and_paramwise_keys_are_the_codes():
    from fp16utils.engine import guard
    from fp16utils.optim.constructor import PARAMWISE_KEYS

    sections = _config_sections()
    assert tuple(_key_table(sections['overflow-guard'])) == guard._KEYS
    init = _parameters(guard.OverflowGuard)
    _check_defaults(_key_table(sections['overflow-guard']), init)
    assert set(_key_table(sections['paramwise-cfg'])) == set(PARAMWISE_KEYS)


def test_a_missing_key_or_a_wrong_default_is_caught():
    keys = {'grad_clip': '`None`', 'loss_scale': '`512`'}
    with pytest.raises(AssertionError):
        _check_defaults(keys, {'loss_scale': 512.0})
    _check_defaults(keys, {'grad_clip': None})


# ------------------------------------------------------------------ differences from mmcv


def test_every_test_the_differences_page_names_exists():
    page = (DOCS / 'reference' / 'differences-mmcv.md').read_text()
    named = re.findall(r'`(tests/[\w/]+\.py)::(\w+)`', page)
    assert len(named) >= 30
    for path, name in named:
        source = ROOT.joinpath(path).read_text()
        assert re.search(rf'^def {name}\(', source, re.M), f'{path} has no {name}'
    items = [line for line in page.splitlines() if line.startswith('- **')]
    assert len(items) >= 25
    for item in page.split('\n- **')[1:]:
        item = item.split('\n\n', 1)[0]
        if '## See also' not in item:
            assert 'Test: `tests/' in item or 'Tests: `tests/' in item, item[:80]


# ----------------------------------------------------------------- home page and README


def _example_and_its_output(page: Path) -> tuple:
    block = re.findall(r'```python\n(.*?)```', page.read_text(), re.S)[0]
    promised = block.rstrip().splitlines()[-1]
    assert promised.startswith('# ')
    return block, promised[2:]


@pytest.mark.parametrize('page', ['README.md', 'docs/index.md'])
def test_the_first_example_prints_what_its_last_comment_says(page, tmp_path, monkeypatch):
    block, promised = _example_and_its_output(ROOT / page)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, page, 'exec'), {'__name__': '__main__'})
    assert out.getvalue().strip().splitlines()[-1] == promised


def test_readme_is_short_and_its_links_reach_files():
    readme = ROOT.joinpath('README.md').read_text()
    assert len(readme.splitlines()) <= 150
    links = re.findall(r'\]\(([^)#\s]+)(?:#[\w-]+)?\)', readme)
    local = [link for link in links if not re.match(r'[a-z]+://', link)]
    assert len(local) >= 20
    for link in local:
        assert ROOT.joinpath(link).is_file(), link
    for goal in ('how-to/legacy-loop.md', 'how-to/mmcv-runner.md', 'how-to/mmengine.md',
                 'migration/index.md'):
        assert f'](docs/{goal})' in readme
        assert f']({goal})' in (DOCS / 'index.md').read_text()


def test_the_changelog_page_includes_the_changelog():
    page = (DOCS / 'changelog.md').read_text()
    assert page.strip() == '--8<-- "CHANGELOG.md"'
