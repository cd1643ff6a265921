"""What the build test stands in for: the model, and the codebases' own optimizer classes.

- The model: a small ``nn.Module`` whose parameter names are those that ``paramwise_cfg``
  ``custom_keys`` and the layer-decay constructors look for (``backbone.layers.N``,
  ``backbone.stages.N.blocks.M``, ``norm``, ``bias``, ``pos_embed``, ``cls_token``,
  ``absolute_pos_embed``, ``relative_position_bias_table``, ``head``...). Its backbone's
  class is named after the config's ``model.backbone.type`` (the layer-decay constructors
  choose their rule by that name: ConvNeXt, BEiT, MAE). A multi-optimizer config gets one
  sub-module per optimizer (generator, discriminator, ...).
- The codebases' classes: layer-decay constructors, Lamb, ... exist only in mmdet 3.x,
  mmsegmentation 1.x and mmpretrain 1.x, which need mmcv 2 and cannot be imported next to
  mmcv 1.7.2. Their source files (``PKG/engine/optimizers/*.py``) are run from the
  downloaded 1.x release with one stand-in: ``from PKG.registry import ...`` gets an
  object whose ``register_module()`` collects the classes; :func:`codebase_classes` then
  registers those of one codebase into MMEngine's registries (``OPTIM_WRAPPER_CONSTRUCTORS``,
  ``OPTIMIZERS``, ``PARAM_SCHEDULERS``: those the codebases' own are children of). The
  classes' code is upstream's, unchanged.
"""

from __future__ import annotations

import builtins
import contextlib
import types
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import mmengine.registry
import torch
from _wheels import NEW, release_root
from torch import nn

#: The parameter names the configs' ``custom_keys`` look for (besides the structure).
_EXTRA = ('pos_block', 'query_embed', 'query_feat', 'level_embed', 'sampling_offsets',
          'reference_points', 'theta', 'phi', 'mask_token')


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.relative_position_bias_table = nn.Parameter(torch.full((3, 2), 0.1))
        self.rel_pos_h = nn.Parameter(torch.full((3, 2), 0.1))
        self.rel_pos_w = nn.Parameter(torch.full((3, 2), 0.1))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.norm1 = nn.LayerNorm(4)
        self.attn = _Attention()
        self.ffn = nn.Linear(4, 4)


class _Stage(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(blocks))
        self.downsample = nn.Module()
        self.downsample.norm = nn.LayerNorm(4)
        self.downsample.reduction = nn.Linear(4, 4, bias=False)


class _StandInBackbone(nn.Module):
    def __init__(self, convnext: bool = False) -> None:
        super().__init__()
        for name in ('cls_token', 'pos_embed', 'absolute_pos_embed'):
            setattr(self, name, nn.Parameter(torch.full((1, 2, 4), 0.1)))
        self.patch_embed = nn.Module()
        self.patch_embed.projection = nn.Conv2d(3, 4, 1)
        self.patch_embed.norm = nn.LayerNorm(4)
        self.layers = nn.ModuleList(_Block() for _ in range(12))  # ViT-like
        if convnext:  # ConvNeXt: backbone.stages.N.M (blocks straight in each stage)
            self.stages = nn.ModuleList(nn.Sequential(*(_Block() for _ in range(n)))
                                        for n in (2, 2, 18, 2))
        else:  # Swin-like: backbone.stages.N.blocks.M, backbone.stages.N.downsample
            self.stages = nn.ModuleList(_Stage(n) for n in (2, 2, 18, 2))
        self.downsample_layers = nn.ModuleList(nn.Conv2d(4, 4, 1) for _ in range(4))
        self.norm = nn.LayerNorm(4)
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        for name in _EXTRA:
            setattr(self, name, nn.Parameter(torch.full((2, 4), 0.1)))


class _Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.conv_seg = nn.Conv2d(4, 3, 1)


def backbone_class(name: Optional[str]) -> type:
    """The stand-in backbone class, named after the config's backbone type."""
    if not name or not name.isidentifier():
        return _StandInBackbone
    convnext = 'ConvNeXt' in name

    def init(self: nn.Module) -> None:
        _StandInBackbone.__init__(self, convnext)
    return type(name, (_StandInBackbone,), {'__init__': init})


class StandInModel(nn.Module):
    """The model the wrappers are built for; ``forward`` returns a float32 scalar loss."""

    def __init__(self, backbone_type: Optional[str] = None,
                 parts: Optional[List[str]] = None) -> None:
        super().__init__()
        if parts:  # one sub-model per optimizer (a GAN's generator, discriminator, ...)
            for name in parts:
                sub = nn.Module()
                sub.backbone = backbone_class(backbone_type)()
                sub.head = _Heads()
                self.add_module(name, sub)
        else:
            self.backbone = backbone_class(backbone_type)()
            self.neck = nn.Linear(4, 4)
            self.decode_head = _Heads()
            self.head = _Heads()

    def forward(self, module: Optional[nn.Module] = None) -> torch.Tensor:
        params = list((module or self).parameters())
        return sum((p.float() * 1.5 - 0.1).pow(2).mean() for p in params)


class _Collector:
    """Stands in for a codebase's registry: ``register_module`` collects the classes."""

    def __init__(self) -> None:
        self.classes: Dict[str, type] = {}

    def register_module(self, name: Optional[str] = None, force: bool = False,
                        module: Optional[type] = None) -> Any:
        def put(cls: type) -> type:
            self.classes[name or cls.__name__] = cls
            return cls
        return put(module) if module is not None else put


class _RegistryModule(types.ModuleType):
    """Stands in for ``PKG.registry``: any registry name it is asked for collects."""

    def __getattr__(self, name: str) -> _Collector:
        if name.startswith('__'):
            raise AttributeError(name)
        collector = self.__dict__[name] = _Collector()
        return collector


#: The folders of a 1.x release whose sources register optimizers, constructors, schedulers.
_FOLDERS = ('engine/optimizers', 'engine/schedulers')
_LOADED: Dict[str, Dict[str, Dict[str, type]]] = {}


def _load_sources(base: Path, codebase: str) -> Dict[str, Dict[str, type]]:
    """Run a 1.x release's ``engine/optimizers`` (and schedulers) with the registry stood in."""
    release = NEW[codebase]
    registry = _RegistryModule(f'{release.package}.registry')
    real_import = builtins.__import__

    def stand_in_import(name: str, globals: Any = None, locals: Any = None,
                        fromlist: Any = (), level: int = 0) -> Any:
        if name == f'{release.package}.registry':
            return registry
        return real_import(name, globals, locals, fromlist, level)

    package = release_root(base, release) / release.package
    for folder in _FOLDERS:
        for source in sorted((package / folder).glob('*.py')):
            if source.name == '__init__.py':
                continue
            namespace: Dict[str, Any] = {
                '__name__': f'_upstream_{release.package}_{source.stem}',
                '__file__': str(source),
                '__builtins__': {**vars(builtins), '__import__': stand_in_import}}
            exec(compile(source.read_text(), str(source), 'exec'), namespace)
    return {key: value.classes for key, value in vars(registry).items()
            if isinstance(value, _Collector)}


@contextlib.contextmanager
def codebase_classes(base: Path, codebase: str) -> Iterator[List[str]]:
    """Within: the codebase's 1.x classes registered in MMEngine's registries (their names).

    As in the codebase's own registries, which are children of MMEngine's, its names win
    over MMEngine's; on leaving, MMEngine's registries are as they were.
    """
    if codebase not in _LOADED:
        _LOADED[codebase] = _load_sources(base, codebase)
    saved = []
    names = []
    for key, classes in _LOADED[codebase].items():
        registry = getattr(mmengine.registry, key)
        for name, cls in classes.items():
            saved.append((registry, name, registry.module_dict.get(name)))
            registry.register_module(name=name, module=cls, force=True)
            names.append(name)
    try:
        yield names
    finally:
        for registry, name, old in reversed(saved):
            if old is None:
                registry.module_dict.pop(name, None)
            else:
                registry.register_module(name=name, module=old, force=True)
