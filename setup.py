"""Builds the optional C fast path of shm.ring (shm/_ringfast.c) and ships the configs inside the
package; all other metadata lives in pyproject.toml.

- C extension: without a compiler the install still succeeds and shm.ring runs its pure-Python
  path. ARL_PURE_PYTHON=1 leaves it out on purpose (a py3-none-any wheel, as scripts/wheelhouse.sh
  builds for a target Python or platform other than this machine's).
- Configs: the checkout's configs/ (default.yaml, sim.yaml, multiturn.yaml, examples/, recipes/) is installed
  as the package directory orchestrator/configs, where orchestrator.config finds the embedded
  default of an installed (non-editable) copy; a checkout keeps reading configs/ at its root.
"""
import os

from setuptools import Extension, find_namespace_packages, setup

PURE = os.environ.get("ARL_PURE_PYTHON", "") == "1"
RING = Extension("shm._ringfast", ["shm/_ringfast.c"], optional=True, extra_compile_args=["-O2"],
                 libraries=["pthread"])

setup(ext_modules=[] if PURE else [RING],
      packages=[*find_namespace_packages(include=["orchestrator*", "shm*"], exclude=["*.__pycache__"]),
                "orchestrator.configs", "orchestrator.configs.examples", "orchestrator.configs.recipes"],
      package_dir={"orchestrator.configs": "configs"},
      package_data={"orchestrator.configs": ["*.yaml"], "orchestrator.configs.examples": ["*.yaml"],
                    "orchestrator.configs.recipes": ["*.yaml"]})
