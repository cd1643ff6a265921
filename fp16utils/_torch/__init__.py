"""What depends on the torch version or the device, and every read of torch's private state.

Callers import the submodule they need (``from .._torch import versions``); one
concept a module:

- :mod:`.versions`: the torch version, native AMP, the default backend.
- :mod:`.dtypes`: the low-precision dtypes and their names.
- :mod:`.tracing`: whether dynamo, TorchScript or a torch-function mode traces.
- :mod:`.probes`: the once-per-process probe cache, which devices are present.
- :mod:`.autocast`: entering autocast per device type, reading its state.
- :mod:`.factory`: building a GradScaler.
- :mod:`.caps`: capabilities per (device, dtype) and the backend rules.
- :mod:`.compat`: hooks with keyword arguments, clipping, copies across torch versions.
- :mod:`.ops`: tensor operations torch keeps private (foreach, flatten, grouping).
- :mod:`.state`: private GradScaler and optimizer state.
- :mod:`.models`: a model's device type, the model inside a DataParallel/DDP.
- :mod:`.decisions`: what a ``torch.compile`` trace reads, decided before any trace
  (at import and by ``decisions.refresh()``).

Tests simulate an old torch by patching ``versions.TORCH_VERSION`` and calling
``decisions.refresh()``; a flag or cache is patched in the module that defines it.
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
