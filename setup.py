"""Builds the optional C fast path of shm.ring (shm/_ringfast.c). Without a compiler the install
still succeeds and shm.ring runs its pure-Python path; all metadata lives in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("shm._ringfast", ["shm/_ringfast.c"], optional=True,
                             extra_compile_args=["-O2"], libraries=["pthread"])])
