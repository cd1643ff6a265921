"""``fp16utils doctor``: run :func:`fp16utils.diagnose_precision` on a model from the command line.

The model comes from a factory (``MODULE:FACTORY``, the input random of
``--input-shape``) or from an OpenMMLab 0.x config (mmdet 2.x's ``build_detector``,
mmseg 0.x's ``build_segmentor``, with a synthetic training batch of the config's
size). torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any, Dict, Optional, TextIO, Tuple

from ..migrate.errors import CommandError, UsageError
from ..migrate.errors import shown_path as _shown

__all__ = ['add_doctor_arguments', 'cmd_doctor']

#: The images of a synthetic batch (two: BatchNorm has statistics to take).
_BATCH = 2


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fp16utils doctor``."""
    parser.add_argument('target', metavar='TARGET',
                        help='MODULE:FACTORY (a function returning the model; MODULE a dotted '
                             'name or a .py file) or an OpenMMLab 0.x CONFIG.py')
    parser.add_argument('--input-shape', metavar='N,C,H,W', default=None,
                        help='shape of the random input (required with MODULE:FACTORY; for a '
                             "config: the image batch, instead of the config's size)")
    parser.add_argument('--dtype', choices=('float16', 'bfloat16'), default='float16',
                        help='the low-precision dtype to try (default: float16)')
    parser.add_argument('--backend', choices=('native', 'legacy'), default='native',
                        help='native: autocast; legacy: a half model (default: native)')
    parser.add_argument('--tolerance', type=_positive_float, default=None,
                        help='largest relative error of a module output (default: 0.05)')
    parser.add_argument('--json', action='store_true', help='machine-readable output')
    parser.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, out: TextIO) -> int:
    """Diagnose the model; print the table (or JSON); 0 when nothing had to be kept."""
    shape = _shape(args.input_shape) if args.input_shape else None
    if ':' in args.target and not args.target.endswith('.py'):
        if shape is None:
            raise UsageError('--input-shape is required with MODULE:FACTORY (e.g. '
                             '--input-shape 2,3,32,32)')
        model, inputs, kwargs, source = _from_factory(args.target, shape)
    elif args.target.endswith('.py'):
        model, inputs, kwargs, source = _from_config(args.target, shape, args)
    else:
        raise UsageError(f'{args.target}: give MODULE:FACTORY or a config file ending in .py')
    from ..debug import diagnose_precision
    from ..debug.doctor import DEFAULT_TOLERANCE

    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    try:
        report = diagnose_precision(model, *inputs, dtype=args.dtype, backend=args.backend,
                                    tolerance=tolerance, **kwargs)
    except (TypeError, ValueError) as err:
        raise CommandError(f'doctor: {err}') from None
    if args.json:
        json.dump(dict(report.to_dict(), input=source), out, indent=2)
        out.write('\n')
    else:
        out.write(f'input: {source}\n{report}\n')
    return 0 if report.ok else 1


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not a number') from None
    if not value > 0 or value == float('inf'):
        raise argparse.ArgumentTypeError(f'{text} is not a number > 0')
    return value


def _shape(text: str) -> Tuple[int, ...]:
    """``'2,3,32,32'`` -> ``(2, 3, 32, 32)``."""
    try:
        shape = tuple(int(p) for p in text.replace('x', ',').split(','))
    except ValueError:
        shape = ()
    if not shape or any(n < 1 for n in shape):
        raise UsageError(f'--input-shape {text}: give positive integers separated by commas, '
                         'e.g. 2,3,32,32')
    return shape


def _from_factory(target: str, shape: Tuple[int, ...]) -> Tuple[Any, tuple, dict, str]:
    """The model a ``MODULE:FACTORY`` returns, and a random input of ``shape``."""
    import torch

    module_name, _, factory_name = target.rpartition(':')
    if not module_name or not factory_name:
        raise UsageError(f'{target}: give MODULE:FACTORY, e.g. my_models:build')
    module = _import(module_name)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UsageError(f'{target}: {module_name} has no function {factory_name!r}')
    try:
        model = factory()
    except Exception as err:  # noqa: BLE001 - the user's factory: one line, not a traceback
        raise CommandError(f'{target}: the factory raised {type(err).__name__}: {err}') from None
    if not isinstance(model, torch.nn.Module):
        raise CommandError(f'{target}: the factory returned {type(model).__name__}, not an '
                           'nn.Module')
    generator = torch.Generator().manual_seed(0)
    return model, (torch.randn(shape, generator=generator),), {}, (
        f'torch.randn{shape} (float32, seed 0) to {target}()')


def _import(name: str) -> Any:
    """Import a module by dotted name (the current folder first on the path) or .py file."""
    if name.endswith('.py'):
        if not os.path.isfile(name):
            raise UsageError(f'{_shown(name)}: no such file')
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(name))[0], name)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        loader = spec.loader  # type: ignore[union-attr]
        try:
            loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as err:  # noqa: BLE001 - the user's file: one line
            raise CommandError(f'{_shown(name)}: importing it raised {type(err).__name__}: '
                               f'{err}') from None
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise UsageError(f'{name}: no such module (run from the folder that holds it, or '
                             'give its .py file)') from None
        raise CommandError(f'{name}: importing it raised ModuleNotFoundError: {err}') from None
    except Exception as err:  # noqa: BLE001 - the user's module: one line
        raise CommandError(f'{name}: importing it raised {type(err).__name__}: {err}') from None


def _from_config(path: str, shape: Optional[Tuple[int, ...]], args: argparse.Namespace
                 ) -> Tuple[Any, tuple, dict, str]:
    """The model of an mmdet 2.x / mmseg 0.x config and a synthetic training batch."""
    if not os.path.isfile(path):
        raise UsageError(f'{_shown(path)}: no such file')
    try:
        import mmcv
    except ImportError:
        raise CommandError(f'{_shown(path)}: building a model from a config needs mmcv 1.x and '
                           'its codebase (mmdet 2.x or mmseg 0.x); or give MODULE:FACTORY'
                           ) from None
    from ..mmcv import patch_mmcv

    patch_mmcv(dtype=args.dtype, backend=args.backend)  # before the codebase binds mmcv's names
    try:
        cfg = mmcv.Config.fromfile(path)
        model, codebase = _build_model(cfg)
    except ImportError as err:
        raise CommandError(f'{_shown(path)}: {err}') from None
    except Exception as err:  # noqa: BLE001 - the config's own failure: one line
        raise CommandError(f'{_shown(path)}: building the model raised '
                           f'{type(err).__name__}: {err}') from None
    model.train()
    img, kwargs, source = _synthetic_batch(cfg, codebase, shape)
    return model, (img,), kwargs, source


def _build_model(cfg: Any) -> Tuple[Any, str]:
    """The model of the config, by the registry of the codebase that has its type."""
    kind = cfg.model.get('type')
    where = dict(train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    try:
        from mmseg.models import SEGMENTORS, build_segmentor
        if SEGMENTORS.get(kind) is not None:
            return build_segmentor(cfg.model, **where), 'mmseg'
    except ImportError:
        pass
    try:
        from mmdet.models import DETECTORS, build_detector
    except ImportError:
        raise ImportError(f'model type {kind!r}: mmseg 0.x does not have it and mmdet 2.x is '
                          'not installed; install the codebase the config belongs to') from None
    if DETECTORS.get(kind) is None:
        raise ImportError(f'model type {kind!r} is neither an mmdet 2.x detector nor an mmseg '
                          '0.x segmentor')
    return build_detector(cfg.model, **where), 'mmdet'


def _find(node: Any, key: str) -> Any:
    """The first value of ``key`` in nested dicts and lists (a pipeline), or None."""
    if isinstance(node, dict):
        if node.get(key) is not None:
            return node[key]
        node = list(node.values())
    if isinstance(node, (list, tuple)):
        for item in node:
            found = _find(item, key) if isinstance(item, (dict, list)) else None
            if found is not None:
                return found
    return None


def _size(cfg: Any, codebase: str) -> Tuple[int, int, str]:
    """(height, width, where they come from) of a training image of the config."""
    data = cfg.get('data', {})
    if codebase == 'mmseg':
        crop = _find(data.get('train', {}).get('pipeline', []), 'crop_size')
        if crop is not None:
            return int(crop[0]), int(crop[1]), 'crop_size of data.train.pipeline (h, w)'
    for split in ('test', 'train'):
        pipeline = data.get(split, {}).get('pipeline', [])
        scale = _find(pipeline, 'img_scale')
        if scale is not None:
            break
    else:
        raise CommandError('the config gives no image size (no img_scale in data.test.pipeline'
                           ' or data.train.pipeline, no crop_size); pass --input-shape N,C,H,W')
    if isinstance(scale, list) and scale and isinstance(scale[0], (list, tuple)):
        scale = scale[0]  # several scales: the first
    divisor = int(_find(pipeline, 'size_divisor') or 32)
    short, long = sorted(int(v) for v in scale)
    height, width = (-(-short // divisor) * divisor, -(-long // divisor) * divisor)
    return height, width, (f'img_scale {tuple(scale)} of data.{split}.pipeline (w, h), '
                           f'padded to a multiple of {divisor}')


def _box_masks(boxes: Any, height: int, width: int) -> Any:
    """mmdet's ``BitmapMasks``, each filling its box (the instance masks of a batch)."""
    import numpy as np
    from mmdet.core import BitmapMasks

    masks = np.zeros((len(boxes), height, width), dtype=np.uint8)
    for mask, (x1, y1, x2, y2) in zip(masks, boxes.round().long().tolist()):
        mask[y1:y2, x1:x2] = 1
    return BitmapMasks(masks, height, width)


def _synthetic_batch(cfg: Any, codebase: str, shape: Optional[Tuple[int, ...]]
                     ) -> Tuple[Any, Dict[str, Any], str]:
    """A random training batch: images, their metas and random ground truth."""
    import numpy as np
    import torch

    if shape is not None:
        if len(shape) != 4:
            raise UsageError(f'--input-shape {shape}: a config takes N,C,H,W')
        (count, channels, height, width), where = shape, '--input-shape'
    else:
        height, width, where = _size(cfg, codebase)
        count, channels = _BATCH, 3
    gen = torch.Generator().manual_seed(0)
    img = torch.randn((count, channels, height, width), generator=gen)
    hw3 = (height, width, 3)
    metas = [dict(img_shape=hw3, ori_shape=hw3, pad_shape=hw3, batch_input_shape=(height, width),
                  scale_factor=np.ones(4, dtype=np.float32), flip=False, flip_direction=None,
                  filename='synthetic.png', ori_filename='synthetic.png') for _ in range(count)]
    classes = int(_find(cfg.model, 'num_classes') or 1)
    if codebase == 'mmseg':
        seg = torch.randint(0, classes, (count, 1, height, width), generator=gen)
        kwargs = dict(img_metas=metas, return_loss=True, gt_semantic_seg=seg)
        truth = f'gt_semantic_seg random over {classes} classes'
    else:
        boxes, labels = [], []
        for _ in range(count):
            xy = torch.rand((3, 2), generator=gen) * torch.tensor([width, height]) * 0.5
            wh = (0.1 + 0.4 * torch.rand((3, 2), generator=gen)) * torch.tensor([width, height])
            boxes.append(torch.cat([xy, xy + wh], dim=1))
            labels.append(torch.randint(0, classes, (3,), generator=gen))
        kwargs = dict(img_metas=metas, return_loss=True, gt_bboxes=boxes, gt_labels=labels)
        truth = f'3 random gt_bboxes per image over {classes} classes'
        if _find(cfg.model, 'mask_head') is not None:  # Mask R-CNN and the like
            kwargs['gt_masks'] = [_box_masks(b, height, width) for b in boxes]
            truth += ', gt_masks filling them'
    source = (f'{count} random images {channels}x{height}x{width} from {where}; {truth}; the '
              "model's default initialisation (no checkpoint), train mode")
    return img, kwargs, source
