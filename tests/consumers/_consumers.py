"""The consumer tier's environment: is it there, and the set-up every test module shares.

Importing this module, where mmcv 1.x, mmdet 2.x and mmsegmentation 0.x are
installed, installs the stand-ins for mmcv's compiled ops (``standins/``),
patches mmcv with fp16utils (before mmdet and mmseg are imported, as
``fp16utils run`` does) and registers ``Fp16ProbeHook``. Elsewhere it only
sets ``SKIP_REASON``; each test module calls :func:`require` first.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STANDINS = HERE / 'standins'
WANTED = {'mmcv': '1.', 'mmdet': '2.', 'mmsegmentation': '0.'}


def _why_not() -> Optional[str]:
    for dist, major in WANTED.items():
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return f'{dist} is not installed'
        if not version.startswith(major):
            return f'{dist} {version} is installed; the tier needs {major}x'
    return None


SKIP_REASON = _why_not()


def require() -> None:
    """Skip the calling test module, with the reason, where the tier's packages are missing."""
    if SKIP_REASON is not None:
        import pytest

        pytest.skip(SKIP_REASON, allow_module_level=True)


if SKIP_REASON is not None:
    SKIP_REASON += ' (the consumer tier runs in the environment that .ci/consumers makes)'
else:
    sys.path.insert(0, str(STANDINS))
    standins = importlib.import_module('_fp16utils_standins')  # mmcv._ext, torchvision

    import torch  # noqa: E402

    import fp16utils  # noqa: E402

    #: How close low precision must stay to float32 with the same weights (relative):
    #: the loss, the whole gradient vector (its norm), an output (to its largest
    #: magnitude). The largest errors measured over 10 (mmdet) and 6 (mmseg) initial
    #: weights: loss 2.6e-4 / 3.6e-4, gradients 1.9e-2 / 6.1e-2, outputs 2.1e-3 /
    #: 1.8e-2 (float16 / bfloat16). The gradient error comes from the ReLUs of freshly
    #: initialised heads, whose inputs sit near 0, where rounding decides the mask.
    TOL = {torch.float16: dict(loss=1e-3, grad=3e-2, out=5e-3),
           torch.bfloat16: dict(loss=2e-3, grad=1e-1, out=3e-2)}

    fp16utils.patch_mmcv()  # before mmdet and mmseg bind mmcv's names
    import mmcv.runner  # noqa: E402

    @mmcv.runner.HOOKS.register_module(force=True)
    class Fp16ProbeHook(mmcv.runner.Hook):
        """Records what the fp16 hook did, from inside a real run (priority VERY_LOW: after it)."""

        records: List[Dict[str, Any]] = []

        @staticmethod
        def fp16_hook(runner: Any) -> Any:
            """fp16utils' hook among the runner's (None: another optimizer hook)."""
            return next((h for h in runner.hooks
                         if isinstance(h, fp16utils.Fp16OptimizerHook)), None)

        def record(self, runner: Any, stage: str, **values: Any) -> None:
            hook = self.fp16_hook(runner)
            first = next(p for p in runner.model.parameters() if p.requires_grad)
            self.records.append(dict(
                stage=stage, iter=runner.iter, hook=hook,
                scale=None if hook is None else hook.loss_scale,
                skipped=None if hook is None else hook.skipped_steps,
                param_dtype=first.dtype, param_sum=float(first.detach().float().sum()),
                **values))

        def before_run(self, runner: Any) -> None:
            self.record(runner, 'before_run')

        def after_train_iter(self, runner: Any) -> None:
            loss = runner.outputs['loss']
            self.record(runner, 'iter', loss=float(loss.detach()), loss_dtype=loss.dtype)




def train(cfg_dict: Dict[str, Any], timestamp: str = 'run') -> Any:
    """Train with the codebase's own ``train_detector`` / ``train_segmentor``; the model.

    The initial weights come from seed 0 (``FP16UTILS_TIER_SEED`` picks another, to see
    how much the checks depend on it).
    """
    import mmcv
    import numpy as np

    cfg = mmcv.Config(cfg_dict)
    if cfg.model.type == 'EncoderDecoder':
        from mmseg.apis import train_segmentor as train_fn
        from mmseg.datasets import build_dataset
        from mmseg.models import build_segmentor as build_model
    else:
        from mmdet.apis import train_detector as train_fn
        from mmdet.datasets import build_dataset
        from mmdet.models import build_detector as build_model
    # Every generator the codebases draw from (weights: torch; shuffling: numpy and
    # random), so a run does not depend on what ran before it in the process.
    seed = int(os.environ.get('FP16UTILS_TIER_SEED', '0'))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    model.init_weights()
    train_fn(model, [build_dataset(cfg.data.train)], cfg, timestamp=timestamp, meta=dict())
    return model


def iters(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The per-iteration records of ``Fp16ProbeHook``."""
    return [r for r in records if r['stage'] == 'iter']


def load_meta(path: Path) -> Dict[str, Any]:
    """The ``meta`` of a checkpoint mmcv wrote."""
    import torch

    return torch.load(path, map_location='cpu', weights_only=False)['meta']


PROBE = [dict(type='Fp16ProbeHook', priority='VERY_LOW')]


def mean(values: List[float]) -> float:
    return sum(values) / len(values)


def loss_grads_outputs(model: Any, watched: Any, *args: Any, **kwargs: Any) -> Any:
    """One training forward and backward: the loss, the gradient vector, ``watched``'s outputs.

    The backward is scaled by 1024 (and the gradients unscaled), as the hook does, so no
    float16 gradient underflows.
    """
    outputs: List[Any] = []
    handle = watched.register_forward_hook(lambda mod, a, out: outputs.append(out.detach()))
    model.zero_grad()
    loss, _ = model._parse_losses(model(*args, **kwargs))
    (loss * 1024).backward()
    handle.remove()
    grads = torch.cat([p.grad.float().flatten() / 1024 for p in model.parameters()
                       if p.grad is not None])
    return loss.detach(), grads, outputs


def run_fp16utils(*args: str, cwd: Path, log: Path) -> subprocess.CompletedProcess:
    """``python -m fp16utils run ARGS`` in a new process, with the stand-ins installed."""
    env = dict(os.environ, FP16UTILS_STANDIN_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(REPO), str(STANDINS)]))
    return subprocess.run([sys.executable, '-m', 'fp16utils', 'run', *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
