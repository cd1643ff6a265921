"""What the getting-started and how-to pages say about their blocks, checked on the blocks.

tests/test_docs_blocks.py runs every block; this file runs the few whose output the
prose states (the skipped steps of a first float16 run, a bare ``LossScaler`` that
resumes) and compares.
"""

from __future__ import annotations

import re
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import torch
from test_docs_troubleshooting import run  # a block run as a user pastes it

from fp16utils import LossScaler

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'


def python_block(page: str, contains: str) -> str:
    """The one ``python`` block (no prompts) of ``docs/<page>`` that holds ``contains``."""
    text = (DOCS / page).read_text()
    found = [b for b in re.findall(r'^```python\n(.*?)^```$', text, re.M | re.S)
             if contains in b and '>>>' not in b]
    assert len(found) == 1, f'docs/{page}: {len(found)} python blocks hold {contains!r}'
    return found[0]


def said(block: str) -> list:
    """What the comments of the block's ``print(...)`` lines say they print."""
    return [c.strip() for c in re.findall(r'^print\(.*\)\s+# (.+)$', block, re.M)]


# ------------------------------------------------ first steps: a first float16 run

FIRST_STEPS = 'getting-started/first-steps.md'


def test_a_first_float16_run_skips_what_the_page_says(tmp_path, monkeypatch):
    _caps.require(torch.float16, 'native', scaled=False)
    block = python_block(FIRST_STEPS, 'first_run(LossScaler())')
    assert "LossScaler(init_scale=2**16, mode='dynamic')" in block
    page = ' '.join((DOCS / FIRST_STEPS).read_text().split())
    stated = re.search(r'(\d+) of the first 20 steps are skipped, and the scale settles at '
                       r'2\\\*\\\*(\d+)', page)
    assert stated, 'first-steps.md no longer says how many steps the first run skips'
    count, power = int(stated.group(1)), int(stated.group(2))
    # The page's figures agree with each other and with the block's comments.
    assert count == 32 - power
    assert said(block) == [f'({count}, {2.0 ** power})', '0 65536.0']

    namespace, printed = run(block, f'{FIRST_STEPS}: float16', tmp_path, monkeypatch)
    assert len(printed) == 2
    skipped, scale = eval(printed[0])  # noqa: S307 - the tuple the block printed
    # Every skip halved mmcv's 2**32 (20 steps are too few for a growth window of 1000).
    assert scale == 2.0 ** 32 / 2 ** skipped
    assert abs(skipped - count) <= 2, f'the page says {count}, this run skipped {skipped}'
    # Started at 2**16, the same run skips at most one step (the block asserts it too).
    low_skipped, low_scale = namespace['skipped'], namespace['scale']
    assert low_skipped <= 1 and printed[1] == f'{low_skipped} {low_scale}'


# ---------------------------------------------- save and resume: a bare LossScaler

SAVE_RESUME = 'how-to/save-resume.md'


def test_a_bare_loss_scaler_resumes_with_the_run(tmp_path, monkeypatch):
    _caps.require(torch.float16, 'native', scaled=False)
    text = (DOCS / SAVE_RESUME).read_text()
    assert '## A bare LossScaler in a plain loop' in text
    block = python_block(SAVE_RESUME, "scaler.load_state_dict(checkpoint['loss_scaler'])")
    assert 'scaler.state_dict()' in block
    namespace, printed = run(block, f'{SAVE_RESUME}: LossScaler', tmp_path, monkeypatch)
    assert printed == said(block) == ['True True']
    saved = torch.load(tmp_path / 'checkpoint.pth')
    state = saved['loss_scaler']
    assert set(state) == set(LossScaler().state_dict())  # mmcv's keys
    assert state['cur_iter'] == saved['iter'] == 20
    # The scale moved during the run: a scaler built afresh would not resume it.
    fresh = namespace['build']()[2].state_dict()
    assert fresh != state and state['cur_scale'] < fresh['cur_scale']
