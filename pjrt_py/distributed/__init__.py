"""Many processes: key-value stores and ``initialize``, as ``jax.distributed`` has.

``pjrt_py.distributed.initialize(...)`` joins (or starts) a job's
coordination service and makes a client that spans the job's processes;
``pjrt_py.distributed.stores`` holds the key-value stores a client
coordinates through (docs/distributed.md).
"""

from __future__ import annotations

from .service import check_coordinator_address, from_environment, initialize, shutdown

__all__ = ["check_coordinator_address", "from_environment", "initialize", "shutdown"]
