from setuptools import setup

# Everything declarative lives in pyproject.toml; setup.py only wires the cffi
# builder, which setuptools cannot take from pyproject.toml yet.
setup(cffi_modules=["build_ffi.py:ffibuilder"])
