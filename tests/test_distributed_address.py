"""The coordinator address ``pjrt_py.distributed.initialize`` hands to jaxlib
is checked first: jaxlib takes it unchecked, and an unresolvable host
crashed it (SIGSEGV, 3 runs in 6)."""

from __future__ import annotations

import socket

import pytest
from conftest import free_port, run_python

import pjrt_py.distributed
from pjrt_py.distributed import check_coordinator_address
from pjrt_py.distributed.service import claim_service_port


@pytest.mark.parametrize(
    ("address", "host", "port"),
    [
        ("127.0.0.1:1234", "127.0.0.1", 1234),
        ("localhost:65535", "localhost", 65535),
        ("[::1]:1", "::1", 1),
    ],
)
def test_good_addresses_give_host_and_port(address: str, host: str, port: int) -> None:
    assert check_coordinator_address(address) == (host, port)


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("localhost", "'host:port'"),
        (":1234", "'host:port'"),
        ("localhost:", "'host:port'"),
        ("localhost:0", "1-65535"),
        ("localhost:65536", "1-65535"),
        ("localhost:-1", "1-65535"),
        ("localhost:12a", "1-65535"),
        ("localhost:１２", "1-65535"),  # fullwidth digits are digits to str.isdigit
        ("::1:1234", "brackets"),
        ("host.invalid:1234", "does not resolve"),
        ("[]:1234", "'host:port'"),
    ],
)
def test_bad_addresses_raise_value_error_naming_the_fault(address: str, says: str) -> None:
    with pytest.raises(ValueError, match="coordinator_address") as info:
        check_coordinator_address(address)
    assert says in str(info.value)


def test_a_non_string_address_is_refused() -> None:
    with pytest.raises(ValueError, match="not int"):
        check_coordinator_address(1234)  # type: ignore[arg-type]


def test_initialize_refuses_an_unresolvable_host_before_jaxlib_sees_it() -> None:
    # In a subprocess: before the check, jaxlib crashed on this address.
    result = run_python(
        """
        from pjrt_py import distributed
        for _ in range(3):
            try:
                distributed.initialize("host.invalid:1234", 1, 0, init_timeout_s=5)
            except ValueError as e:
                print("refused:", "does not resolve" in str(e))
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:3] == ["refused: True"] * 3


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1, ValueError), (0, ValueError), (10**9, ValueError), (1.5, TypeError), (True, TypeError)],
)
def test_init_timeout_is_checked_before_anything_starts(timeout: object, error: type) -> None:
    with pytest.raises(error, match="init_timeout_s"):
        pjrt_py.distributed.initialize("localhost:1234", 1, 0, init_timeout_s=timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, 1.0, "1"])
def test_process_numbers_must_be_ints(value: object) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        pjrt_py.distributed.initialize("localhost:1234", value, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an int"):
        pjrt_py.distributed.initialize("localhost:1234", 2, value)  # type: ignore[arg-type]


def test_a_second_job_on_this_machine_may_not_serve_the_same_port() -> None:
    port = free_port()
    first = claim_service_port("127.0.0.1", port)
    assert first is not None
    try:
        with pytest.raises(ValueError, match=f"port {port} is already served by another pjrt_py"):
            claim_service_port("127.0.0.1", port)
    finally:
        first.close()
    again = claim_service_port("127.0.0.1", port)  # released: free again
    assert again is not None
    again.close()


def test_a_port_another_program_listens_on_is_refused() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ValueError, match="cannot be served here.*in use"):
            claim_service_port("127.0.0.1", port)
        with pytest.raises(ValueError, match="cannot be served here"):
            claim_service_port("localhost", port)
    lock = claim_service_port("127.0.0.1", port)  # the lock was let go with the refusal
    assert lock is not None
    lock.close()


def test_initialize_refuses_a_busy_port_before_jaxlib_serves_it() -> None:
    # In subprocesses: jaxlib's service crashed (SIGSEGV, 5 runs of 5) on a
    # port another program listened on, and two jobs serving one address
    # aborted one of them (8 runs of 11).
    pytest.importorskip("jax", reason="initialize needs jaxlib's coordination service")
    result = run_python(
        """
        import socket
        from pjrt_py import distributed
        from pjrt_py.distributed.service import claim_service_port
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            port = other.getsockname()[1]
            try:
                distributed.initialize(f"127.0.0.1:{port}", 1, 0, init_timeout_s=5)
            except ValueError as e:
                print("listening:", "cannot be served here" in str(e))
        held = claim_service_port("127.0.0.1", port)  # as another job's process 0 would
        try:
            distributed.initialize(f"127.0.0.1:{port}", 1, 0, init_timeout_s=5)
        except ValueError as e:
            print("other job:", "another pjrt_py job" in str(e))
        held.close()
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == ["listening: True", "other job: True"]
