"""What an evaluation ran in, recorded from inside the codebases' own ``tools/test.py``.

A test config imports this module (``custom_imports=dict(imports=['_eval_probe'])``).
It registers a global forward pre-hook that, on the first call of a detector or a
segmentor, watches that model: the dtypes of the inputs, weights and outputs of a
few named submodules, the outputs of its heads (as float32 copies), the dtypes a
``@force_fp32`` method received, and the model's results. When the process exits
they are saved with ``torch.save`` to ``$FP16UTILS_EVAL_RECORD``. Without that variable
(a test process that imports it for the head below) nothing is watched.

It also registers ``KeptRetinaHead``: mmdet's ``RetinaHead`` whose code keeps its box
regression convolution in float32 (``fp16utils.keep_fp32`` in ``__init__``), the way a
0.x model keeps a module in float32 without an edit of ``tools/test.py``.
"""

from __future__ import annotations

import atexit
import os
from typing import Any, Dict, List

import torch
from torch import nn

import fp16utils

#: The submodules watched, where the model has them.
WATCHED = ('backbone.conv1', 'backbone.bn1', 'backbone.stem.0', 'backbone.stem.1',
           'neck.lateral_convs.0.conv', 'bbox_head.retina_cls', 'bbox_head.retina_reg',
           'decode_head.conv_seg')

records: Dict[str, Any] = dict(modules={}, outputs={}, force_fp32=[], results=[], logits=[])
_watched: List[int] = []


def _first_tensor(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _record_module(name: str, module: nn.Module) -> None:
    def hook(mod: nn.Module, args: tuple, output: Any) -> None:
        inp, out = _first_tensor(args), _first_tensor(output)
        weight = getattr(mod, 'weight', None)
        records['modules'].setdefault(name, dict(
            input=None if inp is None else inp.dtype, output=None if out is None else out.dtype,
            weight=None if weight is None else weight.dtype,
            autocast=torch.is_autocast_enabled('cpu')))
        if out is not None:
            records['outputs'].setdefault(name, []).append(out.detach().float().clone())

    module.register_forward_hook(hook)


def _record_force_fp32(owner: nn.Module, method: str) -> None:
    bound = getattr(owner, method)

    def recording(*args: Any, **kwargs: Any) -> Any:
        first = _first_tensor(args)
        records['force_fp32'].append(dict(method=method, dtype=first.dtype,
                                          autocast=torch.is_autocast_enabled('cpu')))
        return bound(*args, **kwargs)

    setattr(owner, method, recording)


def _record_logits(model: nn.Module) -> None:
    inference = model.inference

    def recording(*args: Any, **kwargs: Any) -> Any:
        logits = inference(*args, **kwargs)
        records['logits'].append(logits.detach().float().clone())
        return logits

    model.inference = recording


def _is_model(module: nn.Module) -> bool:
    names = {cls.__name__ for cls in type(module).__mro__}
    return bool(names & {'BaseDetector', 'BaseSegmentor'})


def _watch(module: nn.Module, args: tuple) -> None:
    if not _is_model(module) or _watched:
        return
    _watched.append(id(module))
    named = dict(module.named_modules())
    for name in WATCHED:
        if name in named:
            _record_module(name, named[name])
    head = named.get('bbox_head')
    if head is not None:
        _record_force_fp32(head, '_get_bboxes_single')  # inside @force_fp32 get_bboxes
    if hasattr(module, 'inference'):
        _record_logits(module)
    module.register_forward_hook(lambda mod, a, output: records['results'].append(output))


def _save() -> None:
    path = os.environ.get('FP16UTILS_EVAL_RECORD')
    if path:
        torch.save(records, path)


if os.environ.get('FP16UTILS_EVAL_RECORD'):
    torch.nn.modules.module.register_module_forward_pre_hook(_watch)
    atexit.register(_save)

try:
    from mmdet.models import HEADS
    from mmdet.models.dense_heads import RetinaHead
except ImportError:  # mmseg's configs import this module too
    pass
else:
    @HEADS.register_module(force=True)
    class KeptRetinaHead(RetinaHead):
        """mmdet's RetinaHead, its box regression kept in float32 by its own code."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            fp16utils.keep_fp32(self, 'retina_reg')
