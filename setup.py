import runpy
from pathlib import Path

from setuptools import Extension, setup

# Everything declarative lives in pyproject.toml. setup.py wires the two
# extension modules, which setuptools cannot take from pyproject.toml: the
# cffi module (through its builder) and the native core. The builder is
# loaded by path: a PEP 517 build does not put this directory on sys.path.
builder = runpy.run_path(str(Path(__file__).resolve().parent / "build_ffi.py"))

setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    ext_modules=[Extension("pjrt_py._core", **builder["core_extension"]())],
    # Both modules use the stable ABI: a wheel is tagged for CPython 3.10 and up.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
