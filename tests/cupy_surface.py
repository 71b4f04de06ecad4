"""Print, as JSON, the surface of whichever ``cupy`` is importable (the real one, or the double
when tests/cupy_double is first on PYTHONPATH): what tests/e2e/test_cupy_contract.py compares."""
import inspect
import json
import re
import sys

import cupy
from cupy.cuda import nccl


def params(fn):
    """Parameter names, from a Cython docstring's signature line or from inspect."""
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    if doc and re.match(r"^[\w.]+\(.*\)", doc[0]):
        inner = doc[0][doc[0].index("(") + 1:doc[0].rindex(")")]
        names = [p.split("=")[0].split()[-1] for p in inner.split(",") if p.strip()]
    else:
        names = list(inspect.signature(fn).parameters)
    return [n for n in names if n != "self"]


def public(cls):
    return sorted(n for n in dir(cls) if not n.startswith("_"))


out = {"major": int(cupy.__version__.split(".")[0]), "available": nccl.available}
if nccl.available:
    C = nccl.NcclCommunicator
    out["constants"] = {n: int(getattr(nccl, n)) for n in dir(nccl) if n.startswith("NCCL_")}
    out["functions"] = sorted(n for n in ("get_unique_id", "get_version", "get_build_version",
                                          "groupStart", "groupEnd", "check_status")
                              if callable(getattr(nccl, n, None)))
    out["comm_methods"] = {n: params(getattr(C, n)) for n in public(C)
                           if callable(getattr(C, n)) and n not in ("initAll",)}
    doc = C.__doc__ or ""
    first = doc.strip().splitlines()[0] if re.match(r"^\s*NcclCommunicator\(", doc) else ""
    out["ctor"] = params(C) if first else list(inspect.signature(C.__init__).parameters)[1:]
    out["ctor"] = [p.split()[-1] for p in out["ctor"]]
    if first:
        out["ctor"] = [p.split("=")[0].split()[-1] for p in
                       first[first.index("(") + 1:first.rindex(")")].split(",")]
    uid = nccl.get_unique_id()
    out["uid"] = [type(uid).__name__, len(uid)]
    out["version_type"] = type(nccl.get_version()).__name__
    out["error_is_runtime_error"] = issubclass(nccl.NcclError, RuntimeError)
    out["error_text"] = str(nccl.NcclError(4))
    out["error_status"] = nccl.NcclError(6).status
x_flags = cupy._core.flags.Flags if hasattr(cupy, "_core") else cupy.Flags
out["flags"] = public(x_flags)
out["stream"] = public(cupy.cuda.Stream)
out["event"] = public(cupy.cuda.Event)
out["device"] = public(cupy.cuda.Device)
out["ndarray_get"] = params(cupy.ndarray.get)
out["ndarray_set"] = params(cupy.ndarray.set)
out["stream_init"] = params(cupy.cuda.Stream.__init__)
# what fluidctl (runtime/collective/nccl.py, node/gpustack.py, runtime/gpuinstall.py) calls,
# with its parameters, and what instances carry (Stream.null: no GPU is needed to make it)
runtime = cupy.cuda.runtime
out["runtime"] = {n: params(getattr(runtime, n)) for n in (
    "eventQuery", "eventSynchronize", "streamQuery", "runtimeGetVersion", "getDeviceCount")}
out["runtime_error"] = [str(runtime.CUDARuntimeError(700)), runtime.CUDARuntimeError(719).status,
                        str(runtime.CUDARuntimeError(600))]
out["stream_instance"] = sorted(n for n in vars(cupy.cuda.Stream.null) if not n.startswith("_"))
out["stream_null"] = [cupy.cuda.Stream.null.ptr, cupy.cuda.Stream.null.device_id]
out["calls"] = {
    "get_current_stream": params(cupy.cuda.get_current_stream),
    "Event.__init__": params(cupy.cuda.Event.__init__),
    "Event.record": params(cupy.cuda.Event.record),
    "Stream.record": params(cupy.cuda.Stream.record),
    "Stream.wait_event": params(cupy.cuda.Stream.wait_event),
    "Stream.is_capturing": params(cupy.cuda.Stream.is_capturing),
    "Stream.begin_capture": params(cupy.cuda.Stream.begin_capture),
    "Graph.launch": params(cupy.cuda.graph.Graph.launch),
    "Device.use": params(cupy.cuda.Device.use),
}
out["ndarray_attrs"] = sorted(n for n in ("data", "device", "flags", "dtype", "shape", "size",
                                          "nbytes", "ndim", "get", "set", "reshape", "astype")
                              if hasattr(cupy.ndarray, n))
out["module_functions"] = sorted(n for n in ("empty", "zeros", "asarray", "asnumpy", "ones")
                                 if callable(getattr(cupy, n, None)))
try:                          # without NCCL_CHECK_POINTERS... only the double runs this far
    out["interprocess_timing"] = None
    cupy.cuda.Event(interprocess=True)
except ValueError as exc:     # checked before any CUDA call, so the real one answers too
    out["interprocess_timing"] = str(exc)
except Exception as exc:
    out["interprocess_timing"] = type(exc).__name__
json.dump(out, sys.stdout)
