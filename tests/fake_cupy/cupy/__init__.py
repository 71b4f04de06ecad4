"""A stand-in for CuPy on machines without a GPU: just enough for fluidctl.runtime's device
selection and NCCL unique-id exchange to run for real. FAKE_CUPY_VERSION picks the API era:
14+ passes the NCCL id as bytes, older versions as a tuple of signed chars."""
import os

__version__ = os.environ.get("FAKE_CUPY_VERSION", "14.0.0")

from cupy import cuda  # noqa: E402,F401
