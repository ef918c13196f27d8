"""Plugin discovery, loading, versions and the function-table slot check."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import (
    ADD_F32_8,
    NEEDS_NEWER_PLUGIN,
    build_so,
    forwarding_plugin,
    installed_build,
    newer_plugin,
    run_python,
)

import pjrt_py
from pjrt_py.runtime.discovery import BUILDS, PLATFORMS, find_plugin


def test_plugins_lists_the_installed_cpu_plugin() -> None:
    found = pjrt_py.plugins()
    cpu = [p for p in found if p.name == "cpu"]
    assert cpu, found
    assert Path(cpu[0].path).is_file()
    assert cpu[0].path.endswith(".so")


def test_api_version_is_a_major_minor_pair(client: pjrt_py.Client) -> None:
    major, minor = client.plugin.api_version
    assert (major, minor) >= (0, 40)
    assert isinstance(major, int) and isinstance(minor, int)


def test_plugin_attributes_are_decoded(client: pjrt_py.Client) -> None:
    attrs = client.plugin.attributes
    assert isinstance(attrs.get("stablehlo_current_version"), list)
    assert all(isinstance(v, int) for v in attrs["stablehlo_current_version"])


def test_plugin_is_loaded_once_per_path() -> None:
    assert pjrt_py.load_plugin("cpu") is pjrt_py.load_plugin(find_plugin("cpu"))


def test_missing_path_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        pjrt_py.Client("/nonexistent/plugin.so")


def test_unknown_platform_name_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        pjrt_py.Client("not-a-platform")


def test_shared_library_without_get_pjrt_api_is_refused(tmp_path: Path) -> None:
    so = build_so(tmp_path, "not_a_plugin", "int some_function(void) { return 1; }\n")
    with pytest.raises(pjrt_py.PluginLoadError, match="GetPjrtApi"):
        pjrt_py.load_plugin(str(so))


def test_non_library_file_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not an ELF file")
    with pytest.raises(pjrt_py.PluginLoadError, match="cannot load"):
        pjrt_py.load_plugin(str(bogus))


def test_pjrt_plugin_environment_variable_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_PLUGIN", "/nonexistent/from_env.so")
    with pytest.raises(FileNotFoundError, match="from_env"):
        pjrt_py.Client()
    monkeypatch.setenv("PJRT_PLUGIN", find_plugin("cpu"))
    assert pjrt_py.Client().platform_name == "cpu"


def test_explicit_path_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_PLUGIN", "/nonexistent/from_env.so")
    assert pjrt_py.Client(find_plugin("cpu")).platform_name == "cpu"


# A shim that advertises an older API: it forwards to the real CPU plugin but
# reports a PJRT_Api.struct_size that ends right after PJRT_Client_Compile,
# as a plugin built against an older header would.
OLD_API = """
  api.struct_size = offsetof(PJRT_Api, PJRT_Client_Compile) + sizeof(void*);
  api.pjrt_api_version.minor_version = 7;
"""


def test_function_beyond_struct_size_is_never_called(tmp_path: Path) -> None:
    so = forwarding_plugin(tmp_path, "old_api_shim", str(find_plugin("cpu")), OLD_API)
    # In a subprocess: the shim loads a second copy of the CPU plugin.
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        plugin = pjrt_py.load_plugin({str(so)!r})
        assert plugin.api_version == (0, 7), plugin.api_version
        assert plugin.supports("PJRT_Client_Compile")
        assert not plugin.supports("PJRT_Client_BufferFromHostBuffer")
        try:
            pjrt_py.Client(plugin)
        except pjrt_py.UnsupportedError as e:
            print("UNSUPPORTED:", e)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "UNSUPPORTED:" in result.stdout
    assert "not supported by this plugin (PJRT 0.7" in result.stdout
    assert "PJRT_" in result.stdout


def test_require_names_the_function_and_version(client: pjrt_py.Client) -> None:
    with pytest.raises(pjrt_py.UnsupportedError, match="PJRT_Not_A_Function"):
        client.plugin.require("PJRT_Not_A_Function")
    client.plugin.require("PJRT_LoadedExecutable_Execute")  # present: no error


@NEEDS_NEWER_PLUGIN
def test_newer_plugin_than_our_header_works() -> None:
    result = run_python(
        f"""
        import numpy as np, pjrt_py
        c = pjrt_py.Client({newer_plugin()!r})
        assert c.plugin.api_version > (0, 81), c.plugin.api_version
        exe = c.compile({ADD_F32_8!r})
        out = exe.execute(np.arange(8, dtype=np.float32), np.ones(8, np.float32)).to_numpy()
        assert out.tolist() == list(range(1, 9)), out
        print("OK")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


# -- which build a platform name picks ------------------------------------------


def test_builds_are_ordered_by_the_documented_rule() -> None:
    """Within a platform: builds with no known wrong result first, then newest API."""
    for platform in PLATFORMS:
        builds = [b for b in BUILDS if b.platform == platform and b.api is not None]
        keys = [(bool(b.defects), tuple(-v for v in b.api or ())) for b in builds]
        assert keys == sorted(keys), [b.distribution for b in builds]


def test_cpu_picks_the_first_installed_build_with_no_known_wrong_result() -> None:
    cpu = [p for p in pjrt_py.plugins() if p.name == "cpu"]
    assert cpu[0].default and not any(p.default for p in cpu[1:])
    clean = [p for p in cpu if not p.defects]
    expected = clean[0] if clean else cpu[0]
    assert find_plugin("cpu") == expected.path == pjrt_py.load_plugin("cpu").path
    if installed_build("fastatomstruct-xla-cpu"):  # the default install's dependency
        assert expected.distribution == "fastatomstruct-xla-cpu"


@pytest.mark.parametrize(
    "spec", ["xla-cpu-pjrt", "xla_cpu_pjrt", "XLA-CPU-PJRT", "lammps-jax-pjrt-cpu"]
)
def test_a_build_is_chosen_by_its_distribution_name(spec: str) -> None:
    distribution = spec.lower().replace("_", "-")
    path = installed_build(distribution)
    if path is None:
        pytest.skip(f"{distribution} (in the test extra) is not installed")
    assert find_plugin(spec) == path
    assert pjrt_py.Client(spec).plugin.path == path


def test_pjrt_plugin_takes_a_distribution_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_PLUGIN", "lammps-jax-pjrt-cpu")
    path = installed_build("lammps-jax-pjrt-cpu")
    if path is None:
        pytest.skip("lammps-jax-pjrt-cpu (in the test extra) is not installed")
    assert find_plugin() == path


def test_an_unknown_distribution_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="no such file or installed plugin distribution"):
        find_plugin("numpy")  # installed, but not one library: not a plugin
    with pytest.raises(FileNotFoundError, match="fastatomstruct-xla-cpu"):
        find_plugin("no-such-distribution")


def test_plugin_info_reports_provenance_and_measurements() -> None:
    for info in pjrt_py.plugins():
        build = next(b for b in BUILDS if b.distribution == info.distribution)
        assert info.version and info.api == build.api and info.defects == build.defects
        if build.api is not None:
            assert pjrt_py.load_plugin(info.path).api_version == build.api


# -- extensions ------------------------------------------------------------------

# What each CPU build's extension chain holds, in chain order (docs/tracing.md).
BUILD_EXTENSIONS = {
    "fastatomstruct-xla-cpu": [
        "shardings",
        "phase_compile",
        "ffi",
        "memory_descriptions",
        "layouts",
    ],
    "xla-cpu-pjrt": ["phase_compile", "ffi", "memory_descriptions", "layouts"],
    "lammps-jax-pjrt-cpu": [
        "xla_transform",
        "shardings",
        "phase_compile",
        "ffi",
        "memory_descriptions",
        "layouts",
    ],
}


@pytest.mark.parametrize("distribution", sorted(BUILD_EXTENSIONS))
def test_every_extension_of_a_cpu_build_is_named(distribution: str) -> None:
    path = installed_build(distribution)
    if path is None:
        pytest.skip(f"{distribution} (in the test extra) is not installed")
    extensions = pjrt_py.load_plugin(path).extensions
    assert extensions == BUILD_EXTENSIONS[distribution]
    assert "profiler" not in extensions  # so traces hold host spans only (docs/tracing.md)


def test_native_entry_points_refuse_an_api_address_load_plugin_did_not_give() -> None:
    # These read the PJRT_Api at the address: a stray int was a segfault.
    result = run_python(
        """
        import pjrt_py
        from pjrt_py import _core
        stray = 12345
        calls = {
            "plugin_extensions": lambda: _core.plugin_extensions(stray),
            "stream_extension_usable": lambda: _core.stream_extension_usable(stray),
            "profiler_available": lambda: _core.profiler_available(stray),
            "PluginProfiler": lambda: _core.PluginProfiler(stray, b""),
            "ffi_register": lambda: _core.ffi_register(stray, "x", 0, "cpu"),
            "error_from_pjrt": lambda: _core.error_from_pjrt(stray, 1),
        }
        for name, call in calls.items():
            try:
                call()
            except ValueError as e:
                assert "load_plugin" in str(e), (name, e)
            else:
                raise AssertionError(name)
        real = pjrt_py.Client().plugin.address
        assert isinstance(_core.plugin_extensions(real), list)
        print("OK")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
