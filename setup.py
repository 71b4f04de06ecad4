"""The one native piece, optional: when it cannot be built (no C compiler, no Python headers),
fluidctl installs without it and same-node collectives run their Python path."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("fluidctl.runtime.collective._fastshm",
                             ["fluidctl/runtime/collective/_fastshm.c"],
                             extra_compile_args=["-O3"], optional=True)])
