"""What depends on the torch version or the device, and every read of torch's private state.

One concept a submodule; callers import the one they use (``from .._torch import
versions``). Tests simulate an old torch by patching ``versions.TORCH_VERSION`` and
calling ``decisions.refresh()``; a flag or cache is patched where it is defined.
"""

from __future__ import annotations

from . import (  # noqa: F401  (reachable as attributes: ``_torch.versions``)
    autocast,
    caps,
    compat,
    decisions,
    dtypes,
    factory,
    models,
    ops,
    probes,
    state,
    tracing,
    versions,
)
