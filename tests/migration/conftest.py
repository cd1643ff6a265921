"""The migration tier: ``fp16utils migrate`` on the real OpenMMLab configs (.ci/migration).

The tier's virtualenv has mmengine 0.10.7 (and mmcv 1.7.2); FP16UTILS_WHEELS_DIR names the
folder where it unpacked the 0.x releases (mmdet 2.28.2, mmsegmentation 0.30.0, mmcls
0.25.0, mmedit 0.16.1, mmgen 0.7.3) and their 1.x successors (mmdet 3.3.0,
mmsegmentation 1.2.2, mmpretrain 1.2.0, mmagic 1.2.0). Their configs are read as files;
nothing of them is installed. Without mmengine or the folder each module skips, saying
why (``_wheels.require``). This folder is on ``sys.path`` (its helper modules).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: The helper modules hold no doctests, and some import mmengine: never collected.
collect_ignore_glob = ['_*.py']
