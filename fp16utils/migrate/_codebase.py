"""Which OpenMMLab codebase a 0.x config belongs to: its rules for the ``fp16`` key.

mmdet 2.x training reads ``cfg.fp16``; mmsegmentation 0.x training does not (only its
``tools/test.py`` does). :func:`find_codebase` tells them apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

__all__ = ['CODEBASES', 'find_codebase']

#: The codebase names ``--codebase`` takes.
CODEBASES = ('mmdet', 'mmseg')


def find_codebase(cfg: Mapping[str, Any], codebase: Optional[str],
                  path: Union[str, os.PathLike[str], None]) -> Optional[str]:
    """The codebase given, else the one told from ``path`` and ``cfg``; ``None``: unknown."""
    if codebase is not None and codebase not in CODEBASES:
        raise ValueError(f'codebase: {codebase!r} is not one of {", ".join(CODEBASES)}')
    return codebase
