"""The promises of the Troubleshooting pages, checked on the pages' own blocks.

tests/test_docs_blocks.py runs every block; this file checks what the pages say
about them: the guard and ``find_overflow`` name the layer and the suggested fix
works, the log and error messages quoted are the real ones, and the limits the
pages describe are real.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import AmpOptimWrapper, _torch, find_overflow, kept_fp32, wrap_fp16_model

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs' / 'troubleshooting'
_FENCE = re.compile(r'^```(?P<lang>\w*)\n(?P<body>.*?)^```$', re.M | re.S)
_ANSI = re.compile(r'\x1b\[[0-9;]*m')


def blocks(page: str) -> list:
    """``(lang, body)`` of every fenced block of the page, in page order."""
    text = (DOCS / page).read_text()
    return [(m.group('lang'), m.group('body')) for m in _FENCE.finditer(text)]


def scripts(page: str) -> list:
    return [body for lang, body in blocks(page) if lang == 'python' and '>>>' not in body]


def text_after(page: str, body: str) -> str:
    """The text block that follows the block ``body`` on the page."""
    found = blocks(page)
    index = next(i for i, (_, b) in enumerate(found) if b == body)
    lang, text = found[index + 1]
    assert lang == 'text'
    return text


def run(body: str, name: str, tmp_path: Path, monkeypatch) -> tuple:
    """Run a block as a user pastes it (in an empty folder); (namespace, stdout lines)."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {'__name__': '__main__'}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(body, name, 'exec'), namespace)
    return namespace, out.getvalue().splitlines()


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def fp16_log():
    """The messages of the ``fp16utils`` logger during the test."""
    handler = Records()
    logger = logging.getLogger('fp16utils')
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def _masked(lines: list) -> list:
    """Lines with their numbers masked (the counts depend on float16 arithmetic)."""
    return [re.sub(r'\d+(\.\d+)?(e[+-]?\d+)?', '#', line.rstrip()) for line in lines]


# ----------------------------------------------------------- the scale keeps dropping

PAGE = 'scale-keeps-dropping.md'


@pytest.fixture
def float16():
    _caps.require(torch.float16, 'native')


def _guard_block() -> str:
    return next(b for b in scripts(PAGE) if "overflow_guard=dict(action='diagnose')" in b)


def _recipe_block() -> str:
    return next(b for b in scripts(PAGE) if 'find_overflow(model) as report' in b)


def _fix_block() -> str:
    return next(b for b in scripts(PAGE) if "fp32_modules=['2'])" in b)


@pytest.mark.usefixtures('float16')
def test_the_guard_names_the_layer_and_the_log_shown_is_the_real_one(tmp_path, monkeypatch,
                                                                      fp16_log):
    block = _guard_block()
    namespace, printed = run(block, f'{PAGE}: the guard', tmp_path, monkeypatch)
    wrapper = namespace['optim_wrapper']
    # Every step skipped, the scale halved each time (the printed line and its comment).
    assert printed == ['5 2048.0'] and '# 5 2048.0' in block
    assert wrapper.skipped_steps == 5 and wrapper.loss_scale == 2048.0
    # The guard's one report names module '2', in its forward output, in float16.
    reports = [m for m in fp16_log if 'overflow guard report' in m]
    assert len(reports) == 1
    assert "first non-finite module: '2'" in reports[0]
    assert "find_overflow: non-finite values found; first module: '2' (forward-output)" in (
        reports[0])
    # The page shows the log as it is (numbers masked: float16 arithmetic may vary).
    logged = '\n'.join(fp16_log).splitlines()
    shown = text_after(PAGE, block).splitlines()
    assert _masked(logged) == _masked(shown)
    assert logged[:4] == shown[:4]  # the skips and the guard's first line, exactly


@pytest.mark.usefixtures('float16')
def test_diagnosing_overflow_recipe_finds_the_layer_and_suggests_a_fix(tmp_path, monkeypatch):
    """find_overflow with the loss scale applied names the layer and suggests fp32_modules."""
    block = _recipe_block()
    assert 'optim_wrapper.backward(optim_wrapper.scale_loss(loss))' in block
    namespace, printed = run(block, f'{PAGE}: find_overflow', tmp_path, monkeypatch)
    report = namespace['report']
    assert not report.ok
    assert report.first_module == '2' and report.suggest() == '2'
    assert report.forward.kind == 'forward-output' and report.forward.dtype == torch.float16
    assert report.forward.num_inf == report.forward.numel
    assert printed[-2:] == ['2', '2']  # the values the comments in the block promise
    assert "pass fp32_modules=['2'] to AmpOptimWrapper" in '\n'.join(printed)
    assert namespace['optim_wrapper'].skipped_steps == 0  # the recipe takes no step
    # The report printed is the one the guard logged on the page.
    guard_log = text_after(PAGE, _guard_block()).splitlines()
    start = next(i for i, line in enumerate(guard_log) if line.startswith('find_overflow:'))
    assert _masked(printed[:-2]) == _masked(guard_log[start:start + len(printed) - 2])


@pytest.mark.usefixtures('float16')
def test_the_suggested_fix_stops_the_skips(tmp_path, monkeypatch):
    block = _fix_block()
    assert "fp32_modules=['2']" in block  # the report's suggestion, as the page passes it
    namespace, printed = run(block, f'{PAGE}: the fix', tmp_path, monkeypatch)
    wrapper = namespace['optim_wrapper']
    assert printed == ['0 65536.0'] and '# 0 65536.0' in block
    assert wrapper.skipped_steps == 0 and wrapper.last_result.stepped
    assert torch.isfinite(namespace['loss'])
    # Without the fix, the same model skips every step (the page's guard block).
    unfixed = block.replace(", model=model, fp32_modules=['2']", '')
    assert unfixed != block
    namespace, _ = run(unfixed, f'{PAGE}: unfixed', tmp_path, monkeypatch)
    assert namespace['optim_wrapper'].skipped_steps == 5


# ------------------------------------------------------------------------ NaN losses


def test_a_skipped_step_leaves_the_weights_bit_identical():
    """nan-loss.md: a skipped step is never applied (its first session block, replayed)."""
    _caps.require(torch.bfloat16, 'native', scaled=False)
    import doctest

    session = next(b for lang, b in blocks('nan-loss.md') if '>>>' in b)
    source = ''.join(e.source for e in doctest.DocTestParser().get_examples(session))
    namespace: dict = {}
    exec(compile(source, 'nan-loss.md', 'exec'), namespace)
    torch.manual_seed(0)
    fresh = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    assert namespace['result'].skipped
    for p, q in zip(namespace['model'].parameters(), fresh.parameters()):
        assert torch.equal(p, q)


# --------------------------------------------------------------- AMP is slower on a CPU


def test_the_cache_block_gives_the_weight_its_gradient(tmp_path, monkeypatch):
    _caps.require(torch.bfloat16, 'native', scaled=False)
    block = next(b for b in scripts('slow-on-cpu.md') if 'cache_enabled=False' in b)
    namespace, printed = run(block, 'slow-on-cpu.md: cache', tmp_path, monkeypatch)
    assert printed == ['True']
    assert namespace['wrapper'].last_result.stepped


def test_precision_support_answers_with_the_three_words(tmp_path, monkeypatch):
    block = next(b for b in scripts('slow-on-cpu.md') if 'precision_support' in b)
    namespace, printed = run(block, 'slow-on-cpu.md: precision', tmp_path, monkeypatch)
    support = namespace['precision_support']('cpu')
    assert set(support) == {torch.float16, torch.bfloat16}
    assert set(support.values()) <= {'native', 'emulated', 'unsupported'}
    assert namespace['wrapper'].dtype in (torch.float16, torch.bfloat16, torch.float32)


# ------------------------------------------------------------------ resume on torch 2.6


def _pickled(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def _weights_only_by_default() -> bool:
    """Whether ``torch.load`` refuses a pickled module when not told otherwise."""
    try:
        torch.load(_pickled(nn.Sequential()))
    except Exception:  # noqa: BLE001 - torch's UnpicklingError
        return True
    return False


def _weights_only_reads_floats() -> bool:
    try:
        return torch.load(_pickled({'x': 1.5}), weights_only=True) == {'x': 1.5}
    except Exception:  # noqa: BLE001 - an unpickler without BINFLOAT
        return False


def test_the_checkpoint_of_states_loads_weights_only(tmp_path, monkeypatch):
    _caps.require(torch.float16, 'native')
    if not _weights_only_reads_floats():
        pytest.skip("torch.load(weights_only=True) cannot read python floats here")
    block = next(b for b in scripts('resume-torch26.md') if "'checkpoint.pth'" in b)
    namespace, _ = run(block, 'resume-torch26.md', tmp_path, monkeypatch)
    checkpoint = torch.load(tmp_path / 'checkpoint.pth', weights_only=True)
    wrapper = namespace['optim_wrapper']
    assert set(checkpoint['optim_wrapper']) >= {'loss_scaler', 'fp16_stats', 'state'}
    assert checkpoint['optim_wrapper']['loss_scaler'] == wrapper.state_dict()['loss_scaler']
    fresh = AmpOptimWrapper(torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1),
                            dtype='float16', loss_scale=dict(init_scale=8.))
    assert wrapper.last_result.stepped  # the page saves after a step that was taken
    fresh.load_state_dict(checkpoint['optim_wrapper'])
    assert fresh.loss_scale == wrapper.loss_scale != 8.0


def _quoted_error() -> list:
    lines = next(b for lang, b in blocks('resume-torch26.md') if lang == 'text').splitlines()
    assert lines[0].startswith('_pickle.UnpicklingError: ')
    return lines


def test_the_quoted_error_is_torchs_message():
    if not _weights_only_by_default():
        pytest.skip('torch.load does not default to weights_only here')
    with pytest.raises(Exception) as caught:
        torch.load(_pickled(nn.Sequential(nn.Linear(2, 2))))
    err = caught.value
    actual = _ANSI.sub('', f'{type(err).__module__}.{type(err).__name__}: {err}')
    actual_lines = [line.rstrip() for line in actual.splitlines()]
    for line in _quoted_error():
        assert line.rstrip() in actual_lines, line


def test_the_environment_variable_loads_a_trusted_pickle(tmp_path):
    if not _weights_only_by_default():
        pytest.skip('torch.load does not default to weights_only here')
    path = tmp_path / 'model.pth'
    torch.save(nn.Sequential(nn.Linear(2, 2)), path)
    code = f'import torch; print(type(torch.load({str(path)!r})).__name__)'
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD='1')
    done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == 'Sequential'


def test_old_weights_only_reader_names_the_float_operand():
    if _weights_only_reads_floats():
        pytest.skip('torch.load(weights_only=True) reads python floats here')
    with pytest.raises(Exception, match='Unsupported operand 71'):
        torch.load(_pickled({'scale': 65536.0}), weights_only=True)


def test_an_mmengine_checkpoint_names_its_history_buffer():
    spec = importlib.util.find_spec('mmengine')
    if spec is None or spec.origin is None:  # tests/mmengine is a namespace package
        pytest.skip('mmengine is not installed here (its tier runs this test)')
    if not _weights_only_by_default():
        pytest.skip('torch.load does not default to weights_only here')
    from mmengine.logging import MessageHub

    hub = MessageHub.get_instance('fp16utils-docs-resume')
    hub.update_scalar('train/loss', 1.0)
    with pytest.raises(Exception) as caught:
        torch.load(_pickled({'message_hub': hub.state_dict()}))
    assert ('Unsupported global: GLOBAL mmengine.logging.history_buffer.HistoryBuffer'
            in str(caught.value))


# --------------------------------------------------------------------- scripted norms


def test_convert_then_script_works_for_batchnorm_not_for_groupnorm(script):
    _caps.require(torch.bfloat16)
    page = ' '.join((DOCS / 'scripted-norms.md').read_text().split())
    quoted = "AttributeError: '_PatchedForward' object has no attribute '__globals__'"
    assert f'`{quoted}`' in page
    bn = wrap_fp16_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)),
                         dtype='bfloat16', backend='legacy')
    scripted = script(bn)
    assert scripted(torch.randn(3, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16
    gn = wrap_fp16_model(nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4)),
                         dtype='bfloat16', backend='legacy')
    with pytest.raises(AttributeError) as caught:
        script(gn)
    assert f'{type(caught.value).__name__}: {caught.value}' == quoted


def test_find_overflow_warns_about_a_scripted_module_as_quoted(script):
    page = ' '.join((DOCS / 'scripted-norms.md').read_text().split())
    model = nn.Sequential(nn.Linear(4, 4), script(nn.BatchNorm1d(4)))
    with pytest.warns(UserWarning) as caught:
        with find_overflow(model) as report:
            model(torch.ones(2, 4)).sum().backward()
    message = str(caught[0].message)
    quoted = 'find_overflow() cannot watch TorchScript modules (they take no Python hooks): 1; '
    assert message.startswith(quoted)
    assert f'`{quoted}...`' in page
    assert report.unwatched == ['1'] and report.checked_params == 4


# --------------------------------------------------------------------------- compile


def _compile_reason():
    class Probe(nn.Module):
        fp16_enabled = True

        def forward(self, x):
            return x + 1

    try:
        torch.compile(Probe(), fullgraph=True, backend='eager')(torch.ones(1))
    except Exception as err:  # noqa: BLE001 - whatever stops it: no torch.compile here
        return f'torch.compile does not run here: {str(err).splitlines()[0]}'
    return None


@pytest.fixture
def compiles():
    _caps.require(torch.float16, 'native')
    why = _compile_reason()
    if why is not None:
        pytest.skip(why)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures('compiles')
def test_the_explain_block_finds_no_graph_break(tmp_path, monkeypatch):
    block = next(b for b in scripts('compile.md') if 'explain' in b)
    namespace, printed = run(block, 'compile.md: explain', tmp_path, monkeypatch)
    assert printed == ['1 0', 'torch.float16 torch.float32', 'True']
    assert namespace['explained'].break_reasons == []


@pytest.mark.usefixtures('compiles')
def test_the_compiled_forward_trains(tmp_path, monkeypatch):
    block = next(b for b in scripts('compile.md') if 'update_params' in b)
    namespace, printed = run(block, 'compile.md: wrapper', tmp_path, monkeypatch)
    assert printed == ['True']
    assert namespace['optim_wrapper'].skipped_steps == 0
    assert kept_fp32(namespace['model']) == ['2']  # applied when the wrapper was built
    assert namespace['loss'].dtype == torch.float32


def _limits_row(start: str) -> str:
    page = (DOCS / 'compile.md').read_text()
    return next(line for line in page.splitlines() if line.startswith(start))


@pytest.mark.usefixtures('compiles')
def test_fp32_modules_applied_late_fail_with_the_quoted_message(monkeypatch):
    quoted = re.search(r'carries `([^`]+)`', _limits_row('| `fp32_modules`')).group(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype='float16',
                              fp32_modules=['2'])

    def forward(x):
        with wrapper.optim_context(model):
            return model(x)

    with pytest.raises(Exception) as caught:
        torch.compile(forward, fullgraph=True, backend='eager')(torch.ones(2, 8))
    assert quoted in str(caught.value) or 'Observed exception' in str(caught.value)
    with monkeypatch.context() as mp:  # what optim_context raises inside the trace
        mp.setattr(_torch.tracing, 'is_compiling', lambda: True)
        with pytest.raises(RuntimeError) as raised:
            wrapper.optim_context(model)
    assert str(raised.value) == quoted


@pytest.mark.usefixtures('compiles')
def test_an_armed_guard_fails_fullgraph_but_reports_without_it():
    assert 'with `fullgraph=True` that compiled call fails' in _limits_row('| `overflow_guard`')

    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01),
                                  dtype='float16',
                                  overflow_guard=dict(max_consecutive=1, action='raise'))

        def forward(x):
            with wrapper.optim_context(model):
                return model(x).float().mean()
        return model, wrapper, forward

    bad = torch.ones(4, 4)
    bad[0, 0] = float('inf')
    quiet = logging.getLogger('fp16utils').level
    logging.getLogger('fp16utils').setLevel(logging.ERROR)
    try:
        for fullgraph in (True, False):
            torch._dynamo.reset()
            model, wrapper, forward = setup()
            compiled = torch.compile(forward, fullgraph=fullgraph, backend='eager')
            wrapper.update_params(compiled(bad))  # skipped: the guard is armed
            assert wrapper.skipped_steps == 1
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                if fullgraph:
                    with pytest.raises(Exception) as caught:
                        wrapper.update_params(compiled(bad))
                    assert not isinstance(caught.value, FloatingPointError)
                else:
                    with pytest.raises(FloatingPointError) as caught:
                        wrapper.update_params(compiled(bad))
                    assert caught.value.report.first_module == '0'
    finally:
        logging.getLogger('fp16utils').setLevel(quiet)


def test_torch_jit_script_drops_the_decorators(script):
    _caps.require(torch.bfloat16, 'native', scaled=False)
    from fp16utils import auto_fp16

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.fp16_enabled = False

        @auto_fp16()
        def forward(self, x):
            return self.fc(x)

    row = _limits_row('| `torch.jit.script`')
    assert 'the decorators are dropped without a word' in row
    head = wrap_fp16_model(Head(), dtype='bfloat16')
    assert head(torch.ones(2, 4)).dtype == torch.bfloat16  # eager: @auto_fp16 acts
    scripted = script(head)
    assert scripted(torch.ones(2, 4)).dtype == torch.float32  # scripted: it does not


# ---------------------------------------------------------------- torchvision::nms

TORCHVISION = 'torchvision-nms.md'
QUOTED_NMS = 'RuntimeError: operator torchvision::nms does not exist'


def test_the_nms_error_is_the_one_torch_gives_for_an_operator_never_loaded():
    """torchvision registers a fake kernel for ``torchvision::nms`` as it is imported;
    without its compiled operators torch refuses that with the quoted message."""
    lines = [b for lang, b in blocks(TORCHVISION) if lang == 'text'][0].splitlines()
    assert lines[-1] == QUOTED_NMS
    assert '@torch.library.register_fake("torchvision::nms")' in [ln.strip() for ln in lines]
    assert 'import torchvision' in [ln.strip() for ln in lines]  # mmcv's runner imports it
    if not hasattr(torch.library, 'register_fake'):
        pytest.skip('torch.library.register_fake does not exist in this torch')
    absent = 'fp16utils_docs_absent::nms'  # a namespace no library defines
    with pytest.raises(RuntimeError) as caught:
        torch.library.register_fake(absent)(lambda dets, scores, iou_threshold: dets)
    quoted = QUOTED_NMS.replace('torchvision::nms', absent)
    assert f'{type(caught.value).__name__}: {caught.value}' == quoted


def test_the_nms_page_pairs_torchvision_with_torch_as_the_install_page_and_ci_do():
    page = ' '.join((DOCS / TORCHVISION).read_text().split())
    install = (ROOT / 'docs' / 'getting-started' / 'install.md').read_text()
    torch_pin = re.search(r'^TIER_TORCH=([0-9.]+)$', (ROOT / '.ci' / '_tier.sh').read_text(),
                          re.M).group(1)
    vision_pin = re.search(r'torchvision==([0-9.]+)', (ROOT / '.ci' / 'consumers').read_text()
                           ).group(1)
    command = f'pip install torchvision=={vision_pin} --index-url https://download.pytorch.org/whl/cpu'
    assert command in page and command in install
    assert f'torch=={torch_pin} torchvision=={vision_pin} --index-url' in page
    vision, torch_release = vision_pin.rsplit('.', 1)[0], torch_pin.rsplit('.', 1)[0]
    assert f'torchvision {vision} goes with torch {torch_release}' in page
    assert f'(torchvision {vision_pin} goes with torch {torch_pin})' in ' '.join(install.split())
    # The symptom table sends the message to the page, and the site lists it.
    index = (DOCS / 'index.md').read_text()
    row = next(line for line in index.splitlines() if QUOTED_NMS in line)
    assert f'({TORCHVISION})' in row
    assert f'troubleshooting/{TORCHVISION}' in (ROOT / 'mkdocs.yml').read_text()


def test_the_nms_check_block_names_the_installed_pair(tmp_path, monkeypatch):
    block = next(b for b in scripts(TORCHVISION) if "requires('torchvision')" in b)
    _, printed = run(block, f'{TORCHVISION}: check', tmp_path, monkeypatch)
    assert printed[0] == f'torch {torch.__version__}'
    assert len(printed) == 3
    if importlib.util.find_spec('torchvision') is None:
        assert printed[1:] == ['torchvision is not installed',
                               "ModuleNotFoundError: No module named 'torchvision'"]


# ------------------------------------------------- one page per half-kernel error text

ERROR_PAGES = {
    'not-implemented-for-half.md': '"..." not implemented for \'Half\'',
    'expected-scalar-type.md': 'expected scalar type Half but found Float',
    'input-type-bias-type.md': 'Input type (c10::Half) and bias type (float) should be the same',
}


def _title(page: str) -> str:
    return re.search(r'^# (.+)$', (DOCS / page).read_text(), re.M).group(1)


def _promised(block: str) -> list:
    """What a block says it prints: the comment after each ``print(...)`` line, on the
    same line, or the comment lines right under it (one per line printed)."""
    lines = block.splitlines()
    said = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith('print('):
            continue
        same = re.search(r'\)\s+# (.+)$', line)
        if same:
            said.append(same.group(1))
            continue
        for below in lines[i + 1:]:
            if not below.startswith('# '):
                break
            said.append(below[2:])
    return said


def _torch_message(fn) -> str:
    with pytest.raises(RuntimeError) as caught:  # NotImplementedError is one
        fn()
    return str(caught.value)


@pytest.mark.parametrize('page', sorted(ERROR_PAGES))
def test_each_error_page_is_titled_with_its_error(page):
    assert _title(page) == ERROR_PAGES[page]
    first = next(b for lang, b in blocks(page) if lang == 'text').strip()
    assert len(first.splitlines()) == 1 and first.split(': ', 1)[0] in (
        'RuntimeError', 'NotImplementedError')
    quoted = first.split(': ', 1)[1]
    # The first block is a real instance of the title (the kernel's name for '...').
    assert re.sub(r'"[^"]+"', '"..."', quoted).replace('BFloat16', 'Half') == _title(page)


@pytest.mark.parametrize('page', sorted(ERROR_PAGES))
def test_each_error_page_prints_what_its_comments_say(page, tmp_path, monkeypatch):
    _caps.require(torch.bfloat16)
    promised = 0
    for body in scripts(page):
        _, printed = run(body, page, tmp_path, monkeypatch)
        assert printed == _promised(body), body.splitlines()[0]
        promised += len(printed)
    assert promised >= 3  # the doctor and the fix, at least


def test_the_torch_messages_the_pages_quote_are_torchs():
    """Where the pages quote torch's own operators, this torch says it (torch >= 2)."""
    cdist = _torch_message(lambda: torch.cdist(torch.ones(2, 2, dtype=torch.float16),
                                               torch.ones(2, 2, dtype=torch.float16)))
    assert cdist == '"cdist" not implemented for \'Half\''
    assert '`"cdist" not implemented for \'Half\'`' in ' '.join(
        (DOCS / 'not-implemented-for-half.md').read_text().split())
    if int(torch.__version__.split('.')[0]) < 2:
        pytest.skip('torch < 2 has no float16 kernels for these on the CPU: other errors')
    import torch.nn.functional as F

    half = torch.randn(2, 3, dtype=torch.float16)
    weighted = _torch_message(lambda: F.cross_entropy(half, torch.tensor([0, 1]),
                                                      weight=torch.ones(3)))
    conv = _torch_message(lambda: nn.Conv2d(1, 1, 1)(torch.ones(1, 1, 2, 2,
                                                                dtype=torch.float16)))
    if weighted != ERROR_PAGES['expected-scalar-type.md']:
        pytest.skip(f'this torch words it {weighted!r}')
    assert conv == ERROR_PAGES['input-type-bias-type.md']


def _fixed_block(page: str, marker: str) -> str:
    return next(b for b in scripts(page) if marker in b)


@pytest.mark.parametrize('page, marker, undo, error', [
    ('not-implemented-for-half.md', "fp32_modules=['PairwiseDistance']",
     ",\n                fp32_modules=['PairwiseDistance']", 'not implemented for'),
    ('expected-scalar-type.md', "fp32_modules=['loss']",
     ",\n                        fp32_modules=['loss']", 'expected scalar type BFloat16'),
    ('input-type-bias-type.md', "fp32_modules=['2']",
     ", fp32_modules=['2'])\n", 'should be the same'),
])
def test_without_the_fix_the_same_block_raises_the_pages_error(page, marker, undo, error,
                                                                 tmp_path, monkeypatch):
    _caps.require(torch.bfloat16)
    block = _fixed_block(page, marker)
    assert undo in block
    unfixed = block.replace(undo, ')\nmodel[2].float()\n' if page.startswith('input') else '')
    with pytest.raises(RuntimeError) as caught:
        run(unfixed, f'{page}: unfixed', tmp_path, monkeypatch)
    if not (page.startswith('input') and str(caught.value).startswith('Input type (CPU')):
        assert error in str(caught.value)  # (torch < 2 words the conv's differently)


def test_the_config_on_the_page_keeps_the_class_in_float32(tmp_path, monkeypatch):
    _caps.require(torch.bfloat16, 'native', scaled=False)
    from fp16utils.optim.builder import build_optim_wrapper

    block = next(b for b in scripts('not-implemented-for-half.md')
                 if b.startswith('optim_wrapper = dict('))
    namespace, _ = run(block, 'not-implemented-for-half.md: config', tmp_path, monkeypatch)

    class DeformConv2dPack(nn.Conv2d):
        """Named as mmcv's: the config names the class."""

    model = nn.Sequential(nn.Conv2d(3, 4, 1), DeformConv2dPack(4, 4, 3, padding=1))
    wrapper = build_optim_wrapper(model, namespace['optim_wrapper'])
    assert type(wrapper).__name__ == 'AmpOptimWrapper' and wrapper.dtype == torch.bfloat16
    assert kept_fp32(model) == ['1']


def test_the_overview_and_the_index_send_each_error_to_its_page():
    overview = (DOCS / 'no-half-kernel.md').read_text()
    index = (DOCS / 'index.md').read_text()
    for page, title in ERROR_PAGES.items():
        assert f']({page})' in overview
        row = next(line for line in index.splitlines() if line.startswith(f'| `{title}`'))
        assert row.endswith(f']({page}) |')
    # The overview keeps the anchors the pages and the rest of the site link to.
    for anchor in ('## A function: fp32_function', '## A module: keep_fp32 and fp32_modules'):
        assert anchor in overview


def test_the_scan_findings_link_the_pages_that_exist():
    from fp16utils.migrate import half_kernels

    for page in half_kernels._PAGES.values():
        assert (ROOT / page).is_file(), page
