"""Activation checkpointing (``with_cp=True`` in mmdet/mmseg backbones) with every precision path.

``torch.utils.checkpoint.checkpoint`` runs a block again during backward. The recompute
must see what the forward saw (input dtype, autocast on or off and its dtype), under
``@auto_fp16``, inside a ``keep_fp32`` island, under ``AmpOptimWrapper``'s autocast and on
the legacy backend; the gradients must be those of the run without checkpointing, bit
for bit (the same operations in the same dtypes).
"""

from __future__ import annotations

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from test_docs_guides import python_block
from test_docs_troubleshooting import run as run_block
from torch import nn
from torch.utils.checkpoint import checkpoint

from fp16utils import AmpOptimWrapper, auto_fp16, fp32_function, keep_fp32, wrap_fp16_model

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32 = torch.float32
LOW = _caps.LOW
LEGACY = _caps.LEGACY_LOW


class Block(nn.Module):
    """Records, at each call, the input dtype, CPU autocast and the Linear's output dtype."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.log = log

    def forward(self, x):
        # Logged before the last operation: a non-reentrant recompute stops once it has
        # rebuilt the last saved tensor (torch's early stop), and would skip a later line.
        hidden = self.fc(x)
        self.log.append((x.dtype, _caps.autocast_now('cpu'), hidden.dtype))
        return torch.tanh(hidden)


def run(block, x, cp):
    """The block, checkpointed as mmdet's ``with_cp`` does (``cp`` is use_reentrant) or not."""
    if cp is None or not x.requires_grad:
        return block(x)
    return checkpoint(block, x, use_reentrant=cp)


class Island(nn.Module):
    """A module kept in float32 that checkpoints its own block."""

    def __init__(self, log: list, cp) -> None:
        super().__init__()
        self.block = Block(log)
        self.cp = cp

    def forward(self, x):
        return run(self.block, x, self.cp)


class Net(nn.Module):
    """An mmdet-style backbone: a stem, a checkpointed stage, a head; ``@auto_fp16``."""

    def __init__(self, cp, island: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.log: list = []
        self.stem = nn.Linear(4, 4)
        self.stage = Island(self.log, cp) if island else Block(self.log)
        self.head = nn.Linear(4, 2)
        self.cp = None if island else cp
        self.fp16_enabled = False

    @auto_fp16()
    def forward(self, x):
        return self.head(run(self.stage, self.stem(x), self.cp))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def loss_of(out, y):
    return ((out.float() - y) ** 2).mean()


def step(setup, cp):
    """One forward and backward of ``setup`` with checkpointing ``cp``: (log, grads)."""
    model = Net(cp, island=setup == 'keep_fp32')
    x, y = data()
    if setup in ('auto_fp16', 'keep_fp32'):
        wrap_fp16_model(model, dtype=LOW, backend='native')
        if setup == 'keep_fp32':
            keep_fp32(model, 'stage')
        loss_of(model(x), y).backward()
    elif setup == 'legacy':
        wrap_fp16_model(model, dtype=LEGACY, backend='legacy')
        loss_of(model(x), y).backward()
    else:  # AmpOptimWrapper: the 1.x whole-forward autocast, backward outside it
        backend = 'native' if setup == 'amp_native' else 'legacy'
        wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                                  dtype=LOW if backend == 'native' else LEGACY,
                                  backend=backend, model=model, loss_scale=dict(init_scale=1.))
        with wrapper.optim_context(model):
            out = model(x)
        wrapper.backward(loss_of(out, y))
    return model.log, {n: p.grad.clone() for n, p in model.named_parameters()}


#: (setup, what the checkpointed block sees: input dtype, CPU autocast, output dtype)
SETUPS = {
    'auto_fp16': (LOW, (True, LOW), LOW),
    'keep_fp32': (F32, (False, LOW), F32),
    'amp_native': (LOW, (True, LOW), LOW),
    'legacy': (LEGACY, (False, None), LEGACY),
    'amp_legacy': (LEGACY, (False, None), LEGACY),
}


@pytest.mark.parametrize('use_reentrant', [True, False], ids=['reentrant', 'non-reentrant'])
@pytest.mark.parametrize('setup', list(SETUPS))
def test_the_recompute_runs_as_the_forward_did_and_the_gradients_are_identical(
        setup, use_reentrant):
    if setup in ('auto_fp16', 'keep_fp32', 'amp_native'):
        _caps.require(LOW, 'native', scaled=False)
    plain_log, plain = step(setup, None)
    log, grads = step(setup, use_reentrant)
    seen = SETUPS[setup]
    if seen[1] == (False, None):  # legacy: autocast off, its dtype whatever torch keeps
        seen = (seen[0], (False, _caps.autocast_now('cpu')[1]), seen[2])
    assert plain_log == [seen]
    assert log == [seen, seen]  # the forward, then the recompute during backward
    assert sorted(grads) == sorted(plain)
    for name, grad in plain.items():
        assert grads[name].dtype == grad.dtype and torch.equal(grads[name], grad), name


class Fp32Block(Block):
    """A block whose op runs through fp32_function, checkpointed under autocast."""

    def forward(self, x):
        hidden = fp32_function(torch.sigmoid, cast_output=True)(self.fc(x))
        self.log.append((x.dtype, _caps.autocast_now('cpu'), hidden.dtype))
        return torch.tanh(hidden)


@pytest.mark.parametrize('use_reentrant', [True, False], ids=['reentrant', 'non-reentrant'])
def test_fp32_function_inside_a_checkpointed_block(use_reentrant):
    _caps.require(LOW, 'native', scaled=False)
    results = []
    for cp in (None, use_reentrant):
        torch.manual_seed(0)
        log: list = []
        stem, block = nn.Linear(4, 4), Fp32Block(log)
        x, y = data()
        with torch.autocast('cpu', dtype=LOW):
            out = run(block, stem(x), cp)
        loss_of(out, y[:, :1].expand(-1, 4)).backward()
        results.append((log, [p.grad.clone() for p in (*stem.parameters(), *block.parameters())]))
    (plain_log, plain), (log, grads) = results
    assert plain_log == [(LOW, (True, LOW), LOW)] and log == plain_log * 2
    assert all(torch.equal(a, b) for a, b in zip(grads, plain))


def test_the_how_to_block_prints_true(tmp_path, monkeypatch):
    _caps.require(torch.bfloat16, 'native', scaled=False)
    block = python_block('how-to/legacy-loop.md', 'checkpoint(self.stage')
    _, printed = run_block(block, 'legacy-loop.md: checkpointing', tmp_path, monkeypatch)
    assert printed == ['True']
