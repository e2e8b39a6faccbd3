"""fastshard: a distributed sampler for PyTorch with O(1) memory per rank."""

from __future__ import annotations

from ._version import __version__

try:
    from . import _core  # noqa: F401 - fail early, with advice, when the build is missing
except ImportError as err:  # pragma: no cover - only without a build
    from ._missing_core import missing_core_message

    raise ImportError(missing_core_message(__file__)) from err

from . import readers as readers  # fastshard.readers after `import fastshard`
from ._distributed import InconsistentRanksError
from ._frameworks import ReshardedError
from ._length import LengthGroupedBatchSampler
from ._mixture import MixtureSampler
from ._packed import PackedSampler, PackedTokens, collate_rows
from ._sampler import BatchSampler, DistributedSampler
from ._stream import ReadAmplificationWarning, ShardedStream, ShardReadError
from ._threads import get_num_threads, set_num_threads
from ._token_store import TokenStore
from ._warnings import EpochWarning
from ._watchdog import worker_init_fn
from ._weighted import WeightedDistributedSampler

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "EpochWarning",
    "InconsistentRanksError",
    "LengthGroupedBatchSampler",
    "MixtureSampler",
    "PackedSampler",
    "PackedTokens",
    "ReadAmplificationWarning",
    "ReshardedError",
    "ShardReadError",
    "ShardedStream",
    "TokenStore",
    "WeightedDistributedSampler",
    "__version__",
    "collate_rows",
    "get_num_threads",
    "set_num_threads",
    "worker_init_fn",
]
