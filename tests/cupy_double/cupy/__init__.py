"""A strict CuPy double for machines without a GPU, written from CuPy's sources (v13.6.0 and
v14.2.0: cupy/_core/core.pyx, _core/flags.pyx, cuda/device.pyx, cuda/stream.pyx,
cupy_backends/cuda/libs/nccl.pyx).

Arrays live in host memory registered as "device memory" of the device current (per thread) when
they were made; ``.data.ptr`` is their real address, so NCCL calls are served by pointer and a
wrong pointer, count or dtype gives wrong numbers. What real CuPy refuses, this refuses: implicit
conversion to numpy (``np.asarray(x)``), numpy arrays as operands, ``flags.writeable``.
Streams keep CUDA's order: memory written on one stream and used on another (or read by the
host) without an event wait or a synchronize in between raises ``StreamRace``, which on a GPU
would be a silent race (the legacy null stream synchronises with blocking streams, as in CUDA).
CUPY_DOUBLE_VERSION picks the release (default 14.2.0; 14.0.0a1 still takes the NCCL id as a
tuple), CUPY_DOUBLE_GPUS the number of devices (narrowed by CUDA_VISIBLE_DEVICES as CUDA does:
indices, GPU-/MIG-uuids, one MIG instance), CUPY_DOUBLE_NCCL=0 plays a CuPy installed without
NCCL, CUPY_DOUBLE_NCCL_VERSION NCCL's version (default 23203), CUPY_DOUBLE_CUDA_VERSION the CUDA
CuPy was built for (default 12080), CUPY_DOUBLE_HOST the host a process is on (NCCL reports a
dead peer only across hosts). ``cupy._double.fault(700)`` plays a kernel fault: a sticky CUDA
error every later call returns. The current stream is per thread and per device, as in
stream.pyx; streams and events belong to the device current when they were made.
"""
import numpy as _np

from cupy import _double

__version__ = __import__("os").environ.get("CUPY_DOUBLE_VERSION", "14.2.0")

from numpy import (bool_, dtype, float16, float32, float64, int8, int16, int32,  # noqa: E402
                   int64, uint8, uint16, uint32, uint64, newaxis)  # noqa: F401


class Flags:
    """cupy/_core/flags.pyx: only these three (and their dict-style names)."""

    def __init__(self, c_contiguous, f_contiguous, owndata):
        self._c, self._f, self._o = c_contiguous, f_contiguous, owndata

    c_contiguous = property(lambda self: self._c)
    f_contiguous = property(lambda self: self._f)
    owndata = property(lambda self: self._o)
    fnc = property(lambda self: self._f and not self._c)
    forc = property(lambda self: self._f or self._c)

    def __getitem__(self, name):
        try:
            return {"C_CONTIGUOUS": self._c, "F_CONTIGUOUS": self._f, "OWNDATA": self._o}[name]
        except KeyError:
            raise KeyError("%s is not defined for cupy.ndarray.flags" % name) from None


class MemoryPointer:
    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id

    @property
    def device(self):
        from cupy.cuda import Device
        return Device(self.device_id)


def _current_stream():
    from cupy import cuda
    return cuda.get_current_stream()


def _before_use():
    """Work on an array waits (in stream order) for what was queued before on this stream;
    returns that stream, its op count advanced."""
    s = _current_stream()
    s._order()
    s._tick += 1
    return s


def _unwrap(v):
    if isinstance(v, ndarray):
        _double.used(v.data.ptr, _current_stream())
        return v._a
    if isinstance(v, _np.ndarray):
        raise TypeError(f"Unsupported type {type(v)}")
    if isinstance(v, tuple):
        return tuple(_unwrap(i) for i in v)
    if isinstance(v, list):
        return [_unwrap(i) for i in v]
    return v


def _wrap(r, device=None):
    if isinstance(r, _np.generic):
        r = _np.asarray(r)
    if isinstance(r, _np.ndarray):
        out = ndarray._of(r, _double.current_device() if device is None else device)
        if r.base is None:                      # a new array: written on this stream
            _double.wrote(out.data.ptr, _current_stream())
        return out
    return r


def _written(x):
    _double.wrote(x.data.ptr, _current_stream())
    return x


def _touch(x, write=False, stream=None):
    """``x`` is read (and written) by work on ``stream`` (the current one)."""
    stream = stream or _current_stream()
    _double.used(x.data.ptr, stream)
    if write:
        _double.wrote(x.data.ptr, stream)


class ndarray:
    __slots__ = ("_a", "_dev", "_own", "__weakref__")

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("the double makes arrays through cupy functions only")
        a = _np.empty(shape, dtype=dtype, order=order)
        self._a, self._dev, self._own = a, _double.current_device(), True
        _double.register(a, self._dev)

    @classmethod
    def _of(cls, a, device):
        self = object.__new__(cls)
        own = a.base is None
        self._a, self._dev, self._own = a, device, own
        if own:
            _double.register(a, device)
        return self

    # numpy conversion is explicit in CuPy
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    __array_priority__ = 100

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """numpy scalars and ufuncs on CuPy arrays run as CuPy's own (numpy arrays refused)."""
        if method != "__call__":
            return NotImplemented
        _before_use()
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        r = ufunc(*_unwrap(inputs), **kwargs)
        if out is not None:
            for o in out:
                if isinstance(o, ndarray):
                    _written(o)
            return out[0] if len(out) == 1 else out
        return _wrap(r, self._dev)

    def get(self, stream=None, order="C", out=None, blocking=True):
        s = stream or _current_stream()
        _touch(self, stream=s)
        s.synchronize()
        return _np.array(self._a, order=order)

    def set(self, arr, stream=None):
        if not isinstance(arr, _np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray (got {type(arr)})")
        if arr.shape != self._a.shape:
            raise ValueError("Shape mismatch. Old shape: %s, new shape: %s"
                             % (self._a.shape, arr.shape))
        if arr.dtype != self._a.dtype:
            raise TypeError("{} array cannot be set to {} array".format(arr.dtype, self.dtype))
        s = stream or _current_stream()
        s.synchronize()                                  # pageable copy: the host waits
        _touch(self, write=True, stream=s)
        self._a[...] = arr

    @property
    def data(self):
        return MemoryPointer(self._a.__array_interface__["data"][0], self._dev)

    @property
    def device(self):
        from cupy.cuda import Device
        return Device(self._dev)

    @property
    def flags(self):
        return Flags(self._a.flags.c_contiguous, self._a.flags.f_contiguous, self._own)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    T = property(lambda self: _wrap(self._a.T, self._dev))

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return "array(" + repr(self._a)[6:] if repr(self._a).startswith("array(") else repr(self._a)

    def _host_scalar(self):
        _touch(self)
        _current_stream().synchronize()
        return self._a

    def __float__(self):
        return float(self._host_scalar())

    def __int__(self):
        return int(self._host_scalar())

    def __bool__(self):
        return bool(self._host_scalar())

    def item(self):
        return self._host_scalar().item()

    def tolist(self):
        return self._host_scalar().tolist()

    def __getitem__(self, index):
        _before_use()
        _touch(self)
        return _wrap(self._a[_unwrap(index)], self._dev)

    def __setitem__(self, index, value):
        _before_use()
        _touch(self, write=True)
        self._a[_unwrap(index)] = _unwrap(value)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def fill(self, value):
        _before_use()
        _touch(self, write=True)
        self._a.fill(value)


def _binary(name):
    def op(self, other):
        _before_use()
        _touch(self, write=name.startswith("__i"))
        r = getattr(self._a, name)(_unwrap(other))
        if r is NotImplemented:
            return r
        if name.startswith("__i"):
            return self
        return _wrap(r, self._dev)
    op.__name__ = name
    return op


for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
           "xor", "lshift", "rshift"):
    for _form in ("__%s__", "__r%s__", "__i%s__"):
        setattr(ndarray, _form % _n, _binary(_form % _n))
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(ndarray, "__%s__" % _n, _binary("__%s__" % _n))
ndarray.__hash__ = None


def _unary(name):
    def op(self):
        _before_use()
        _touch(self)
        return _wrap(getattr(self._a, name)(), self._dev)
    return op


for _n in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(ndarray, _n, _unary(_n))


def _method(name):
    def m(self, *args, **kwargs):
        _before_use()
        _touch(self, write=name == "fill")
        r = getattr(self._a, name)(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        return _wrap(r, self._dev)
    m.__name__ = name
    return m


for _n in ("sum", "mean", "max", "min", "argmax", "argmin", "astype", "copy", "reshape",
           "ravel", "flatten", "transpose", "any", "all", "clip", "dot", "cumsum", "squeeze",
           "take", "var", "std", "prod", "view"):
    setattr(ndarray, _n, _method(_n))


def _function(name):
    def f(*args, **kwargs):
        _before_use()
        r = getattr(_np, name)(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()})
        return _wrap(r)
    f.__name__ = name
    return f


for _n in ("maximum", "minimum", "exp", "log", "sqrt", "abs", "tanh", "where", "argmax",
           "sum", "mean", "dot", "matmul", "concatenate", "stack", "allclose", "array_equal",
           "isfinite", "square", "sign", "clip", "ascontiguousarray", "empty", "zeros", "ones",
           "full", "arange", "linspace", "empty_like", "zeros_like", "ones_like", "full_like"):
    globals()[_n] = _function(_n)


def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray):
        if a._dev != _double.current_device():
            return array(a, dtype=dtype)
        return a if dtype is None or _np.dtype(dtype) == a.dtype else a.astype(dtype)
    return array(a, dtype=dtype)


def array(obj, dtype=None, copy=True, order="K", ndmin=0):
    if isinstance(obj, ndarray):
        _before_use()
        return _wrap(_np.array(obj._a, dtype=dtype, order=order, ndmin=ndmin))
    _current_stream().synchronize()               # host-to-device copy from pageable memory
    return _wrap(_np.array(obj, dtype=dtype, order=order, ndmin=ndmin))


def asnumpy(a, stream=None, order="C", out=None):
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order)
    return _np.asarray(a, order=order)


def get_array_module(*args):
    import sys
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


from cupy import cuda  # noqa: E402,F401
