"""Compile caches: in memory per client, and on disk across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ADD_F32_8, NEEDS_NEWER_PLUGIN, other_build, run_python

import pjrt_py
from pjrt_py.programs.compile_options import encode_compile_options


def scaled(k: int) -> str:
    """A distinct small program per k."""
    return f"""
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {{
  %c = stablehlo.constant dense<{k}.0> : tensor<8xf32>
  %0 = stablehlo.multiply %x, %c : tensor<8xf32>
  return %0 : tensor<8xf32>
}}
"""


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.pjrtpy"))


# -- in memory --------------------------------------------------------------------
def test_same_program_and_options_is_a_lookup() -> None:
    client = pjrt_py.Client()
    first = client.compile(ADD_F32_8)
    assert (client.compile_cache.hits, client.compile_cache.misses) == (0, 1)
    for _ in range(100):
        again = client.compile(ADD_F32_8)
    assert client.compile_cache.hits == 100 and client.compile_cache.misses == 1
    assert len(client.compile_cache) == 1
    assert again._program is first._program  # one compiled program, shared


def test_different_options_or_program_compile_again() -> None:
    client = pjrt_py.Client()
    a = client.compile(ADD_F32_8)
    portable = encode_compile_options(compile_portable_executable=True)
    b = client.compile(ADD_F32_8, compile_options=portable)
    c = client.compile(scaled(2))
    assert client.compile_cache.misses == 3
    assert len({id(e._program) for e in (a, b, c)}) == 3


def test_deleting_a_cached_executable_leaves_the_others_working() -> None:
    client = pjrt_py.Client()
    a = client.compile(ADD_F32_8)
    b = client.compile(ADD_F32_8)
    a.delete()
    with pytest.raises(ValueError, match="deleted"):
        a.execute(np.ones(8, np.float32), np.ones(8, np.float32))
    out = b.execute(np.ones(8, np.float32), np.ones(8, np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.full(8, 2, np.float32))
    c = client.compile(ADD_F32_8)  # still cached: no compile
    assert client.compile_cache.misses == 1 and c._program is b._program


def test_cache_false_compiles_anew() -> None:
    client = pjrt_py.Client()
    a = client.compile(ADD_F32_8)
    b = client.compile(ADD_F32_8, cache=False)
    assert a._program is not b._program
    assert client.compile_cache.hits == 0 and len(client.compile_cache) == 1


def test_the_memory_cache_is_bounded() -> None:
    client = pjrt_py.Client()
    client.compile_cache.capacity = 3
    for k in range(5):
        client.compile(scaled(k))
    assert len(client.compile_cache) == 3
    client.compile(scaled(4))  # the newest stayed
    assert client.compile_cache.hits == 1
    client.compile(scaled(0))  # the oldest went
    assert client.compile_cache.misses == 6


# -- on disk ----------------------------------------------------------------------
def test_a_second_client_loads_from_disk(tmp_path: Path) -> None:
    first = pjrt_py.Client(cache_dir=tmp_path)
    exe = first.compile(ADD_F32_8)
    assert first.disk_cache is not None and first.disk_cache.writes == 1
    assert len(entries(tmp_path)) == 1
    second = pjrt_py.Client(cache_dir=tmp_path)
    loaded = second.compile(ADD_F32_8)
    assert second.disk_cache is not None
    assert (second.disk_cache.hits, second.disk_cache.writes) == (1, 0)
    assert loaded.fingerprint == exe.fingerprint
    assert [s.name for s in loaded.input_signature] == ["x", "y"]
    out = loaded.execute(np.ones(8, np.float32), np.ones(8, np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.full(8, 2, np.float32))


def test_a_fresh_process_loads_from_disk_via_the_environment(tmp_path: Path) -> None:
    pjrt_py.Client(cache_dir=tmp_path).compile(ADD_F32_8)
    code = f"""
        import numpy as np, pjrt_py
        c = pjrt_py.Client()  # cache_dir from $PJRT_PY_CACHE_DIR
        exe = c.compile({ADD_F32_8!r})
        assert c.disk_cache.hits == 1 and c.disk_cache.writes == 0
        print(exe.execute(np.ones(8, np.float32), np.ones(8, np.float32)).to_numpy()[0])
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PJRT_PY_CACHE_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2.0"


def test_cache_dir_false_overrides_the_environment(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PJRT_PY_CACHE_DIR", str(tmp_path))
    assert pjrt_py.Client().disk_cache is not None
    assert pjrt_py.Client(cache_dir=False).disk_cache is None


def nested_header() -> bytes:
    """An envelope whose header nests deeper than json reads: RecursionError
    escaped deserialize() and every compile that found it in the cache."""
    from pjrt_py.programs import serialization as ser  # noqa: PLC0415

    header = b"[" * 100_000 + b"]" * 100_000
    return ser._PREFIX.pack(ser.MAGIC, ser.FORMAT, len(header)) + header


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "empty", "garbage", "nested", "huge"])
def test_a_damaged_entry_is_ignored_and_rewritten(tmp_path: Path, damage: str) -> None:
    pjrt_py.Client(cache_dir=tmp_path).compile(ADD_F32_8)
    (entry,) = entries(tmp_path)
    good = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(good[: len(good) - 100])
    elif damage == "corrupt":
        entry.write_bytes(good[:-50] + bytes(50))
    elif damage == "empty":
        entry.write_bytes(b"")
    elif damage == "nested":
        entry.write_bytes(nested_header())
    elif damage == "huge":  # sparse: 64 GiB were read on every compile of the program
        os.truncate(entry, 64 << 30)
    else:
        entry.write_bytes(os.urandom(len(good)))
    client = pjrt_py.Client(cache_dir=tmp_path)
    exe = client.compile(ADD_F32_8)
    assert client.disk_cache is not None
    assert (client.disk_cache.rejected, client.disk_cache.writes) == (1, 1)
    assert entry.read_bytes() != b"" and client.deserialize(entry.read_bytes())
    out = exe.execute(np.ones(8, np.float32), np.ones(8, np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.full(8, 2, np.float32))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_an_entry_that_is_not_a_regular_file_is_a_miss(tmp_path: Path, kind: str) -> None:
    # In a subprocess: a FIFO in an entry's place blocked the compile that
    # read it for good, and a link to /dev/zero read until memory ran out.
    pjrt_py.Client(cache_dir=tmp_path).compile(ADD_F32_8)
    (entry,) = entries(tmp_path)
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "dev-zero":
        entry.symlink_to("/dev/zero")
    else:
        entry.mkdir()
    result = run_python(
        f"""
        import numpy as np
        import pjrt_py
        ADD_F32_8 = {ADD_F32_8!r}
        client = pjrt_py.Client(cache_dir={str(tmp_path)!r})
        out = client.compile(ADD_F32_8).execute(np.ones(8, np.float32), np.ones(8, np.float32))
        print(out.to_numpy().tolist(), client.disk_cache.misses)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == f"{[2.0] * 8} 1"


def test_concurrent_processes_share_a_directory(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import numpy as np, pjrt_py
        c = pjrt_py.Client(cache_dir={str(tmp_path)!r})
        for k in range(6):
            exe = c.compile({ADD_F32_8!r}.replace("stablehlo.add", "stablehlo.add" if k % 2 else "stablehlo.subtract"))
            exe.execute(np.ones(8, np.float32), np.ones(8, np.float32)).to_numpy()
        print("OK")
        """  # noqa: E501
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
        assert b"OK" in out
    assert len(entries(tmp_path)) == 2  # one per program, each whole
    assert not list(tmp_path.glob(".tmp-*"))  # no temporary file left behind
    client = pjrt_py.Client(cache_dir=tmp_path)
    for entry in entries(tmp_path):
        client.deserialize(entry.read_bytes())


def test_the_disk_cache_keeps_to_its_size_bound(tmp_path: Path) -> None:
    probe = pjrt_py.Client(cache_dir=tmp_path / "probe")
    probe.compile(scaled(0))
    size = entries(tmp_path / "probe")[0].stat().st_size
    client = pjrt_py.Client(cache_dir=tmp_path / "c", cache_max_bytes=int(size * 2.5))
    disk = client.disk_cache
    assert disk is not None
    for k in range(2):
        client.compile(scaled(k))
    # Entry ages made explicit: scaled(0) used last, scaled(1) long ago.
    stale = disk.path(client_key(client, scaled(1)))
    fresh = disk.path(client_key(client, scaled(0)))
    os.utime(stale, ns=(10**9, 10**9))
    os.utime(fresh, ns=(2 * 10**9, 2 * 10**9))
    client.compile(scaled(2))  # a third entry does not fit: the stalest goes
    kept = entries(tmp_path / "c")
    assert len(kept) == 2 and stale not in kept and fresh in kept
    assert sum(p.stat().st_size for p in kept) <= disk.max_bytes


def client_key(client: pjrt_py.Client, program: str) -> str:
    """The disk entry name a client uses for a program with default options."""
    options = encode_compile_options()
    return client._compiler.disk_key(client, program, program.encode(), options)


def test_a_hit_refreshes_an_entry_for_lru(tmp_path: Path) -> None:
    a = pjrt_py.Client(cache_dir=tmp_path)
    a.compile(scaled(0))
    a.compile(scaled(1))
    for p in entries(tmp_path):
        os.utime(p, ns=(10**9, 10**9))  # both long unused
    b = pjrt_py.Client(cache_dir=tmp_path)
    b.compile(scaled(0))  # a disk hit marks its entry used now
    assert b.disk_cache is not None and b.disk_cache.hits == 1
    hit = b.disk_cache.path(client_key(b, scaled(0)))
    assert [p for p in entries(tmp_path) if p.stat().st_mtime_ns > 10**9] == [hit]


def test_bad_cache_settings_raise(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="max_bytes"):
        pjrt_py.Client(cache_dir=tmp_path, cache_max_bytes=-1)
    monkeypatch.setenv("PJRT_PY_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="PJRT_PY_CACHE_MAX_BYTES"):
        pjrt_py.Client(cache_dir=tmp_path)
    monkeypatch.delenv("PJRT_PY_CACHE_MAX_BYTES")
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is not a directory"):  # was FileExistsError
        pjrt_py.Client(cache_dir=a_file)


@NEEDS_NEWER_PLUGIN
def test_another_xla_build_never_loads_an_entry(tmp_path: Path) -> None:
    # Same program, same directory, a different plugin build: its own key,
    # so it compiles and writes a second entry instead of loading the first.
    pjrt_py.Client(cache_dir=tmp_path).compile(ADD_F32_8)
    result = run_python(
        f"""
        import pjrt_py
        c = pjrt_py.Client({other_build()!r}, cache_dir={str(tmp_path)!r})
        c.compile({ADD_F32_8!r})
        assert c.disk_cache.hits == 0 and c.disk_cache.writes == 1, vars(c.disk_cache)
        print("OK")
        """
    )
    assert result.returncode == 0, result.stderr
    assert len(entries(tmp_path)) == 2


def test_an_entry_filed_under_another_key_is_a_miss(tmp_path: Path) -> None:
    # Copying one program's entry over another's name must not run the first
    # program when the second is asked for.
    one = pjrt_py.Client(cache_dir=tmp_path)
    one.compile(ADD_F32_8)
    (add_entry,) = entries(tmp_path)
    sub = ADD_F32_8.replace("stablehlo.add", "stablehlo.subtract")
    one.compile(sub)
    (sub_entry,) = [e for e in entries(tmp_path) if e != add_entry]
    sub_entry.write_bytes(add_entry.read_bytes())
    client = pjrt_py.Client(cache_dir=tmp_path)
    exe = client.compile(sub)
    assert client.disk_cache is not None and client.disk_cache.rejected == 1
    out = exe.execute(np.ones(8, np.float32), np.ones(8, np.float32)).to_numpy()
    np.testing.assert_array_equal(out, np.zeros(8, np.float32))


def test_temporaries_of_dead_writers_are_trimmed(tmp_path: Path) -> None:
    from pjrt_py.programs.cache import STALE_TMP_SECONDS

    stale, fresh = tmp_path / ".tmp-dead.pjrtpy", tmp_path / ".tmp-live.pjrtpy"
    stale.write_bytes(b"x" * 100)
    fresh.write_bytes(b"y" * 100)
    old = time.time() - STALE_TMP_SECONDS - 60
    os.utime(stale, (old, old))
    pjrt_py.Client(cache_dir=tmp_path).compile(ADD_F32_8)  # a write trims
    assert not stale.exists()
    assert fresh.exists()  # a writer may still be at work on it


def test_an_empty_cache_dir_is_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cache_dir must name a directory"):
        pjrt_py.Client(cache_dir="")
    assert list(tmp_path.iterdir()) == []


# lammps-jax-pjrt-cpu expands digamma itself from text: -inf at +-0, where
# jaxlib's expansion (the bytecode form) gives NaN, as jax does.
DIGAMMA = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = chlo.digamma %x : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_a_program_compiled_in_one_form_is_not_found_in_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pjrt_py.programs import form  # noqa: PLC0415

    client = pjrt_py.Client(cache_dir=tmp_path)
    default_form = form.identity(client.plugin)
    monkeypatch.setenv(form.ENV, "text")
    as_text = client.compile(ADD_F32_8)
    monkeypatch.delenv(form.ENV)
    again = client.compile(ADD_F32_8)
    assert client.disk_cache is not None
    if default_form == "text":  # no jaxlib, or no version reported: one form only
        assert client.compile_cache.hits == 1 and len(entries(tmp_path)) == 1
        return
    assert client.compile_cache.hits == 0 and client.compile_cache.misses == 2
    assert client.disk_cache.hits == 0 and len(entries(tmp_path)) == 2
    assert again._program is not as_text._program


@pytest.mark.skipif(
    not any(p.distribution == "lammps-jax-pjrt-cpu" for p in pjrt_py.plugins()),
    reason="needs lammps-jax-pjrt-cpu, whose own digamma expansion differs from jaxlib's",
)
def test_a_cache_hit_computes_what_a_fresh_compile_does(tmp_path: Path) -> None:
    code = f"""
        import os, sys, numpy as np, pjrt_py
        c = pjrt_py.Client("lammps-jax-pjrt-cpu", cache_dir={str(tmp_path)!r})
        x = np.array([0.0, -0.0, 1.0, -1.0], np.float32)
        print(c.compile({DIGAMMA!r}).execute(x).to_numpy()[:2].tolist())
    """
    text = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PJRT_PY_PROGRAM_FORM": "text"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0, text.stderr
    default = run_python(code)
    assert default.returncode == 0, default.stderr
    fresh = pjrt_py.Client("lammps-jax-pjrt-cpu", cache_dir=False)
    want = fresh.compile(DIGAMMA).execute(np.array([0.0, -0.0, 1, -1], np.float32)).to_numpy()
    assert default.stdout.strip() == str(want[:2].tolist())


def test_a_nested_header_is_a_serialization_error() -> None:
    with pytest.raises(pjrt_py.SerializationError, match="damaged header"):
        pjrt_py.Client(cache_dir=False).deserialize(nested_header())


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_cache_dir_that_links_to_nothing_says_so(tmp_path: Path, link: str) -> None:
    path = tmp_path / "cache"
    path.symlink_to(tmp_path / "nowhere" / "x" if link == "dangling" else path)
    with pytest.raises(NotADirectoryError, match="symbolic link to nothing"):
        pjrt_py.Client(cache_dir=path)  # was: FileExistsError [Errno 17] File exists
