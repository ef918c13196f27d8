"""Many processes: a client per process, coordinated through jaxlib's
coordination service (``pjrt_py.distributed.initialize``).

Process 0 hosts the service (a gRPC server in jaxlib); every process,
process 0 included, connects a service client to it, and gives its PJRT
client a ``JaxCoordinationStore`` over that connection with
``num_nodes`` / ``node_id`` set, so the plugin exchanges topologies (and, on
GPU, collective ids) through it. This is the arrangement jax uses.

Only plugins that read the key-value callbacks can run this way: the CUDA
plugin does; no CPU build does (see ``pjrt_py.client_options.refuse_multiprocess_cpu``),
and ``initialize`` refuses a CPU plugin before starting anything.

Teardown (``shutdown``, also registered for interpreter exit): the PJRT
client is closed, the processes meet at a barrier (none may leave while a
peer still needs the service), the service client stops, and process 0 stops
the service last. jaxlib aborts a process whose service becomes unreachable
(a peer that died, a coordinator that stopped early), which is why this
order matters; a test of it runs each process as a subprocess.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import socket
import tempfile
import threading
from typing import IO, Any

from ..client import Client
from ..runtime.errors import UnsupportedError
from ..runtime.plugin import load_plugin
from .stores import JaxCoordinationStore

# Launcher environments: (process id, process count) variables.
_LAUNCHERS = (
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)

_lock = threading.Lock()
_state: dict[str, Any] = {}


def from_environment() -> tuple[int, int] | None:
    """``(process_id, num_processes)`` from SLURM, Open MPI or PMI variables."""
    for rank, size in _LAUNCHERS:
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None


def check_coordinator_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a coordinator address, checked before jaxlib sees it.

    jaxlib takes the address unchecked, and a host that does not resolve
    crashed it about one run in three (SIGSEGV in its gRPC client). Accepted:
    ``host:port`` and ``[IPv6]:port``, a port in 1-65535, a host that
    resolves.

    Raises
    ------
    ValueError
        Naming the address and what is wrong with it.
    """
    if not isinstance(address, str):
        raise ValueError(
            f"coordinator_address must be a 'host:port' string, not {type(address).__name__}"
        )
    host, colon, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(
            f"coordinator_address {address!r}: write an IPv6 host in brackets, '[::1]:1234'"
        )
    if not colon or not host or not port_text:
        raise ValueError(f"coordinator_address {address!r} is not of the form 'host:port'")
    if not port_text.isascii() or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(
            f"coordinator_address {address!r}: the port must be a number in 1-65535, "
            f"not {port_text!r}"
        )
    port = int(port_text)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(
            f"coordinator_address {address!r}: the host {host!r} does not resolve ({e})"
        ) from None
    return host, port


def claim_service_port(host: str, port: int) -> IO[str] | None:
    """Check that process 0 can serve on ``(host, port)``, and keep other
    pjrt_py jobs on this machine from serving there: returns the held lock
    (release it with ``.close()``), or None where the lock file is another
    user's.

    jaxlib's gRPC server crashes the process when it cannot bind: on a port
    another program listened on, ``initialize`` died of SIGSEGV 5 runs of 5
    (jax's own ``initialize`` too). And gRPC binds with ``SO_REUSEPORT``, so
    a second job serving the same address started as well, and the two jobs'
    clients met each other's service, which aborted one of them (8 runs of
    11). So: an exclusive lock per port in the temporary directory (jobs on
    this machine), then a trial bind without ``SO_REUSEPORT`` (anything else
    listening there). A program that takes the port between this check and
    the service's bind still crashes jaxlib; the window is a few milliseconds.

    Raises
    ------
    ValueError
        Naming the port and what holds it.
    """
    lock: IO[str] | None
    try:
        path = os.path.join(tempfile.gettempdir(), f"pjrt_py_coordinator_{port}.lock")
        lock = open(path, "a")  # noqa: SIM115 (held until shutdown, past this call)
    except PermissionError:
        lock = None  # another user's job made it: only the trial bind can tell
    if lock is not None:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise ValueError(
                f"coordinator port {port} is already served by another pjrt_py job on this "
                "machine: give each job its own coordinator_address"
            ) from None
    failures = []
    for family, kind, proto, _, where in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as trial:
            trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            try:
                trial.bind(where)
                return lock  # gRPC serves if one resolved address binds
            except OSError as e:
                failures.append(f"{where[0]}: {e.strerror or e}")
    if lock is not None:
        lock.close()
    raise ValueError(
        f"coordinator address {host}:{port} cannot be served here ({'; '.join(failures)}): "
        "another program listens on that port, or the host is not this machine's"
    )


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    plugin: Any = None,
    options: dict[str, Any] | None = None,
    init_timeout_s: int = 300,
    key_prefix: str = "pjrt_py/",
) -> Client:
    """Start or join the coordination service; return this process's client.

    Parameters
    ----------
    coordinator_address : str
        ``host:port`` of process 0 (which serves there). Default
        ``$PJRT_PY_COORDINATOR``.
    num_processes, process_id : int
        This job's size and this process's index. Default: the launcher's
        variables (SLURM, Open MPI, PMI), else ``$PJRT_PY_NUM_PROCESSES`` /
        ``$PJRT_PY_PROCESS_ID``.
    plugin : str, Plugin, optional
        The plugin (``Client``'s first argument). It must read the key-value
        callbacks (CUDA does; CPU builds do not).
    options : dict, optional
        More client options; ``num_nodes`` and ``node_id`` are set here.
    init_timeout_s : int
        How long to wait for every process to connect.
    key_prefix : str
        Namespace of this job's keys in the service.

    Raises
    ------
    UnsupportedError
        For a CPU plugin (before anything starts).
    ValueError
        For missing or inconsistent process numbers, an ``init_timeout_s``
        outside (0, 86400] (a ``TypeError`` if not an int), a coordinator address
        that is not ``host:port`` with a port in 1-65535 and a host that
        resolves (``check_coordinator_address``), or a second call.
    """
    address = coordinator_address or os.environ.get("PJRT_PY_COORDINATOR")
    launched = from_environment()
    if num_processes is None:
        num_processes = launched[1] if launched else _env_int("PJRT_PY_NUM_PROCESSES")
    if process_id is None:
        process_id = launched[0] if launched else _env_int("PJRT_PY_PROCESS_ID")
    if address is None or num_processes is None or process_id is None:
        raise ValueError(
            "initialize needs coordinator_address, num_processes and process_id (or a SLURM / "
            "Open MPI environment, or $PJRT_PY_COORDINATOR, $PJRT_PY_NUM_PROCESSES, "
            "$PJRT_PY_PROCESS_ID)"
        )
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} is not in [0, {num_processes})")
    if isinstance(init_timeout_s, bool) or not isinstance(init_timeout_s, int):
        raise TypeError(f"init_timeout_s must be an int of seconds, got {init_timeout_s!r}")
    if not 0 < init_timeout_s <= 86400:
        raise ValueError(f"init_timeout_s must be in (0, 86400] seconds, got {init_timeout_s}")
    host, port = check_coordinator_address(address)
    from jax._src.lib import _jax  # type: ignore[attr-defined]  # jaxlib: optional

    loaded = load_plugin(plugin) if not hasattr(plugin, "address") else plugin
    if loaded.platform == "cpu" and num_processes > 1:
        raise UnsupportedError(
            f"{loaded.path} is a CPU plugin: no CPU build runs across processes through the "
            "PJRT C API (docs/distributed.md)"
        )
    with _lock:
        if _state:
            raise ValueError("pjrt_py.distributed is already initialized in this process")
        service = port_lock = connection = None
        try:
            if process_id == 0:
                port_lock = claim_service_port(host, port)
                service = _jax.get_distributed_runtime_service(address, num_processes)
            connection = _jax.get_distributed_runtime_client(
                address, process_id, init_timeout=init_timeout_s
            )
            connection.connect()
            store = JaxCoordinationStore(connection, key_prefix)
            settings = dict(options or {})
            if num_processes > 1:  # one process needs no node options (0.115 refuses them)
                settings.update(num_nodes=num_processes, node_id=process_id)
            client = Client(loaded, settings, kv_store=store)
        except BaseException:
            if connection is not None:
                connection.shutdown()
            if service is not None:
                service.shutdown()
            if port_lock is not None:
                port_lock.close()
            raise
        _state.update(client=client, connection=connection, service=service, port_lock=port_lock)
    return client


def shutdown(barrier_timeout_s: int = 300) -> None:
    """Close the client, meet the other processes, stop the service client,
    then (process 0) the service. Safe to call twice; runs at exit."""
    with _lock:
        if not _state:
            return
        client, connection, service = _state["client"], _state["connection"], _state["service"]
        port_lock = _state["port_lock"]
        _state.clear()
    client.close()
    try:
        connection.wait_at_barrier("pjrt_py_shutdown", barrier_timeout_s * 1000)
    finally:
        connection.shutdown()
        if service is not None:
            service.shutdown()
        if port_lock is not None:
            port_lock.close()  # another job may serve the port now


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value is not None else None


atexit.register(shutdown)

__all__ = [
    "check_coordinator_address",
    "claim_service_port",
    "from_environment",
    "initialize",
    "shutdown",
]
