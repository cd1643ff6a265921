"""Which 1.x config is the upstream conversion of a 0.x config.

1.x renamed many files (``faster_rcnn_r50_fpn_1x_coco.py`` ->
``faster-rcnn_r50_fpn_1x_coco.py``; mmsegmentation reordered the parts,
``upernet_beit-base_8x2_640x640_160k_ade20k.py`` ->
``beit-base_upernet_8xb2-160k_ade20k-640x640.py``), so names alone do not pair them.
Two rules, in this order:

1. The checkpoint: the 1.x metafiles list, for most models, the very checkpoint the 0.x
   config trained (its ``Weights`` URL). A 0.x config is that checkpoint's when the 0.x
   metafiles give it that URL, or when OpenMMLab's upload layout names it: the URL's
   folder is the 0.x config's name (``.../v2.0/faster_rcnn/<config name>/<file>.pth``), or
   the file is (``<config name>_<yyyymmdd>_<hhmmss>-<hash>.pth``, as mmgen's, re-uploaded
   for mmagic). A 1.x config whose metafile lists the 0.x config's checkpoint is its
   conversion.
2. The name: the same folder, and the same file name once ``-`` and ``_`` are read alike.

A 0.x config that the checkpoint rule pairs with several 1.x configs takes the one the
name rule picks, else stays unpaired (counted as ambiguous).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import yaml

#: A checkpoint's file name: the config's name, the date and time, a hash.
_CHECKPOINT_FILE = re.compile(r'^(?P<config>.+)_\d{8}_\d{6}-[0-9a-f]{8}\.pth$')


@dataclass(frozen=True)
class Pair:
    """A 0.x config and its 1.x conversion (paths relative to the configs folders)."""

    old: str
    new: Optional[str]
    rule: str  # 'checkpoint', 'name', 'ambiguous' or 'none'


def _models(metafile: Path) -> Iterator[Dict[str, Any]]:
    try:
        data = yaml.safe_load(metafile.read_text(encoding='utf-8'))
    except (yaml.YAMLError, UnicodeDecodeError):
        return
    models = data.get('Models') if isinstance(data, dict) else None
    for model in models or []:
        if isinstance(model, dict) and isinstance(model.get('Config'), str):
            yield model


def _weights(model: Dict[str, Any]) -> List[str]:
    value = model.get('Weights')
    values = value if isinstance(value, list) else [value]
    return [v.strip() for v in values if isinstance(v, str) and v.strip().endswith('.pth')]


def _config_rel(config: str, root: Path) -> Optional[str]:
    """A metafile's ``Config: configs/x/y.py`` as a path under ``root`` (None: not there)."""
    if '://' in config:  # mmgen's metafiles give the config's URL on GitHub
        config = 'configs/' + config.split('/configs/', 1)[-1]
    parts = PurePosixPath(config).parts
    rel = PurePosixPath(*parts[1:]) if parts and parts[0] == 'configs' else PurePosixPath(config)
    return rel.as_posix() if (root / rel).is_file() else None


def checkpoints(root: Path) -> Dict[str, Set[str]]:
    """``{checkpoint URL: {config path}}`` from a release's metafiles."""
    found: Dict[str, Set[str]] = defaultdict(set)
    for metafile in sorted(root.rglob('*.y*ml')):
        if metafile.suffix not in ('.yml', '.yaml'):
            continue
        for model in _models(metafile):
            rel = _config_rel(model['Config'], root)
            if rel is None:
                continue
            for url in _weights(model):
                found[url].add(rel)
    return found


def name_key(rel: str) -> Tuple[str, str]:
    """The folder and the file name with ``-`` read as ``_`` (the name rule's key)."""
    path = PurePosixPath(rel)
    return path.parent.as_posix(), path.stem.replace('-', '_')


def pair_configs(old_root: Path, old_configs: List[str], new_root: Path,
                 new_configs: List[str]) -> Dict[str, Pair]:
    """The pair of each 0.x config (``old_configs``, relative to ``old_root``)."""
    old_set = set(old_configs)
    by_checkpoint: Dict[str, Set[str]] = defaultdict(set)  # 0.x config -> 1.x configs
    new_set = set(new_configs)
    old_urls = checkpoints(old_root)
    for url, news in checkpoints(new_root).items():
        news = {n for n in news if n in new_set}
        owners = {o for o in old_urls.get(url, ()) if o in old_set}
        named = {PurePosixPath(url).parent.name}
        found = _CHECKPOINT_FILE.match(PurePosixPath(url).name)
        if found:
            named.add(found['config'])
        owners |= {o for o in old_set if PurePosixPath(o).stem in named}
        for owner in owners:
            by_checkpoint[owner] |= news
    by_name: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    for rel in new_configs:
        by_name[name_key(rel)].append(rel)
    pairs = {}
    for rel in old_configs:
        named = by_name.get(name_key(rel), [])
        named_one = named[0] if len(named) == 1 else None
        candidates = by_checkpoint.get(rel, set())
        if len(candidates) == 1:
            pairs[rel] = Pair(rel, next(iter(candidates)), 'checkpoint')
        elif candidates:
            if named_one in candidates:
                pairs[rel] = Pair(rel, named_one, 'checkpoint')
            else:
                pairs[rel] = Pair(rel, None, 'ambiguous')
        elif named_one is not None:
            pairs[rel] = Pair(rel, named_one, 'name')
        else:
            pairs[rel] = Pair(rel, None, 'none')
    return pairs
