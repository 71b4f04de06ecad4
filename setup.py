"""The one native piece, optional: when it cannot be built (no C compiler, no Python headers),
fluidctl installs without it and same-node collectives run their Python path.
FLUIDCTL_PURE_WHEEL=1 (fluidctl.envs.PURE_WHEEL) leaves it out: ``fluidctl cluster setup``
builds a pure wheel, which installs on nodes of any Python version."""
import os

from setuptools import Extension, setup

PURE = os.environ.get("FLUIDCTL_PURE_WHEEL", "").strip() == "1"
setup(ext_modules=[] if PURE else [Extension("fluidctl.runtime.collective._fastshm",
                                             ["fluidctl/runtime/collective/_fastshm.c"],
                                             extra_compile_args=["-O3"], optional=True)])
