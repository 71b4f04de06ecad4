"""cupy.cuda of the double: Device (current device per thread, as CUDA's runtime keeps it),
Stream / Event (queued work runs in order on a thread per stream), runtime, nccl."""
import itertools
import os
import threading
import weakref

from cupy import _double

_ptrs = itertools.count(0x7000)
_streams = {}                 # ptr -> Stream (for NCCL calls, which get the raw handle)
_events = weakref.WeakValueDictionary()   # ptr -> Event (runtime.eventQuery gets the raw handle)


# cudaGetErrorName / cudaGetErrorString of the statuses the double gives (real CuPy's texts)
_ERRORS = {
    1: ("cudaErrorInvalidValue", "invalid argument"),
    35: ("cudaErrorInsufficientDriver",
         "CUDA driver version is insufficient for CUDA runtime version"),
    100: ("cudaErrorNoDevice", "no CUDA-capable device is detected"),
    101: ("cudaErrorInvalidDevice", "invalid device ordinal"),
    400: ("cudaErrorInvalidResourceHandle", "invalid resource handle"),
    401: ("cudaErrorIllegalState", "the operation cannot be performed in the present state"),
    600: ("cudaErrorNotReady", "device not ready"),
    700: ("cudaErrorIllegalAddress", "an illegal memory access was encountered"),
    710: ("cudaErrorAssert", "device-side assert triggered"),
    715: ("cudaErrorIllegalInstruction", "an illegal instruction was encountered"),
    719: ("cudaErrorLaunchFailure", "unspecified launch failure"),
    900: ("cudaErrorStreamCaptureUnsupported",
          "operation not permitted when stream is capturing"),
    901: ("cudaErrorStreamCaptureInvalidated",
          "operation failed due to a previous error during capture"),
    907: ("cudaErrorCapturedEvent",
          "operation not permitted on an event last recorded in a capturing stream"),
    999: ("cudaErrorUnknown", "unknown error"),
}


class _Runtime:
    """cupy_backends/cuda/api/runtime.pyx: ``CUDARuntimeError(status)`` names the status;
    ``eventQuery``/``streamQuery`` return cudaEventQuery's status as is (0, 600 =
    cudaErrorNotReady, or a fault); the others raise through check_status. A sticky fault
    (``_double.fault(700)``: a kernel hit an illegal address) is what every later call
    returns, as in a CUDA context after such an error."""

    class CUDARuntimeError(RuntimeError):
        def __init__(self, status):
            self.status = status
            name, text = _ERRORS.get(status, ("cudaErrorUnknown", "unknown error"))
            super().__init__("%s: %s" % (name, text))

        def __reduce__(self):
            return (type(self), (self.status,))

    errorInvalidValue = 1
    errorMemoryAllocation = 2
    errorInvalidResourceHandle = 400
    errorContextIsDestroyed = 709
    errorPeerAccessAlreadyEnabled = 704

    def _check(self):
        if _double.sticky:
            raise self.CUDARuntimeError(_double.sticky)

    def deviceGetPCIBusId(self, device):
        """cudaDeviceGetPCIBusId: the bus id of the physical GPU behind ``device`` (the
        double derives it from the CUDA_VISIBLE_DEVICES entry, so two processes that see one
        GPU get the same id)."""
        self._check()
        if not 0 <= int(device) < _double.device_count():
            raise self.CUDARuntimeError(101)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        items = [v.strip() for v in visible.split(",")] if visible is not None else []
        name = items[int(device)] if int(device) < len(items) else str(int(device))
        if name.startswith("MIG-"):
            name = "mig"                       # the double's MIG instances share one GPU
        bus = int(name) + 0x10 if name.isdigit() else \
            0x80 + int(__import__("zlib").crc32(name.encode())) % 0x70
        return "0000:%02X:00.0" % bus

    def runtimeGetVersion(self):
        # cudaRuntimeGetVersion: the CUDA this CuPy was built for (12080: 12.8); no GPU needed
        return int(os.environ.get("CUPY_DOUBLE_CUDA_VERSION", "12080"))

    def getDeviceCount(self):
        self._check()
        return _double.device_count()

    def eventQuery(self, event):
        if _double.sticky:
            return _double.sticky
        ev = _events.get(int(event))
        if ev is None:
            return 400
        if ev._captured:
            return 907                  # cudaErrorCapturedEvent
        return 0 if ev._done.is_set() else 600

    def eventSynchronize(self, event):
        self._check()
        ev = _events.get(int(event))
        if ev is None:
            raise self.CUDARuntimeError(400)
        if ev._captured:
            raise self.CUDARuntimeError(907)
        ev._done.wait()
        self._check()

    def streamQuery(self, stream):
        if _double.sticky:
            return _double.sticky
        s = _streams.get(int(stream))
        if s is None:
            return 400
        if s._captured is not None:
            s._captured.invalid = True
            return 900
        return 0 if s._worker is None or s._worker.idle() else 600

    def getDevice(self):
        return _double.current_device()

    def setDevice(self, index):
        if not 0 <= index < _double.device_count():
            raise self.CUDARuntimeError(101)
        _double.set_device(index)

    def deviceSynchronize(self):
        self._check()
        for s in list(_streams.values()):
            s.synchronize()


runtime = _Runtime()
CUDARuntimeError = _Runtime.CUDARuntimeError


class Device:
    def __init__(self, device=None):
        self.id = _double.current_device() if device is None else int(device)
        self._before = []

    def use(self):
        runtime.setDevice(self.id)

    def __enter__(self):
        self._before.append(_double.current_device())
        self.use()
        return self

    def __exit__(self, *exc):
        _double.set_device(self._before.pop())

    def __int__(self):
        return self.id

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return "<CUDA Device %d>" % self.id

    def synchronize(self):
        runtime.deviceSynchronize()

    @property
    def pci_bus_id(self):
        # device.pyx: runtime.deviceGetPCIBusId(self.id)
        return runtime.deviceGetPCIBusId(self.id)


def get_device_id():
    return _double.current_device()


_tls = threading.local()


def _current():
    """stream.pyx's _ThreadLocal: per thread, a current stream for EACH device, and a stack
    of (device, previous stream) for ``with stream:``."""
    if not hasattr(_tls, "current"):
        _tls.current, _tls.stack = {}, []
    return _tls


class Event:
    """stream.pyx's Event: ``ptr``, ``done``, ``record``, ``synchronize`` (no other public
    attribute). CUDA ties an event to the device current when it was made: recording it on a
    stream of another device is cudaErrorInvalidResourceHandle."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = 0
        if interprocess and not disable_timing:
            raise ValueError('Timing must be disabled for interprocess events')
        runtime._check()
        self.ptr = next(_ptrs)
        self._device = _double.current_device()
        self._timing = not disable_timing
        _double.events_made["timing" if self._timing else "plain"] += 1
        self._done = threading.Event()
        self._done.set()
        self._stream, self._tick, self._known = None, 0, {}
        self._captured = False          # last recorded in a capturing stream
        _events[self.ptr] = self

    @property
    def done(self):
        # stream.pyx: return runtime.eventQuery(self.ptr) == 0 (a fault is "not done")
        return runtime.eventQuery(self.ptr) == 0

    def record(self, stream=None):
        stream = stream or get_current_stream()
        runtime._check()
        stream_device = stream.device_id if stream.device_id != -1 else \
            _double.current_device()
        if stream_device != self._device:
            raise runtime.CUDARuntimeError(400)          # cudaEventRecord across devices
        self._done = threading.Event()
        self._stream, self._tick, self._known = stream, stream._tick, dict(stream._known)
        self._captured = stream._captured is not None
        stream._enqueue(self._done.set)

    def synchronize(self):
        _double.waited(self.ptr)
        runtime.eventSynchronize(self.ptr)
        if self._stream is not None:
            _double.host_saw(self._stream, self._tick, self._known)


def _check_stream_device_match(device_id):
    current = _double.current_device()
    if device_id == -1:
        device_id = current
    if device_id != current:
        raise RuntimeError(f'The device that the stream is created on ({device_id})'
                           f' does not match with the current device ({current})')
    return device_id


class Stream:
    """stream.pyx's Stream: ``ptr``, ``device_id`` (-1 for the null stream), the property
    ``is_non_blocking``; ``use()`` and ``with`` refuse a stream of another device than the
    current one; the current stream is per thread and per device."""
    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        runtime._check()
        self.ptr = 0 if null else next(_ptrs)
        self.device_id = -1 if null else _double.current_device()
        self._non_blocking = bool(non_blocking) and not null
        self._worker = None
        self._tick = 0                # ops queued so far (stream order bookkeeping)
        self._known = {}              # stream ptr -> tick this stream has waited for
        self._lock = threading.Lock()
        self._captured = None         # while capturing: the work, for cupy.cuda.graph.Graph
        _streams[self.ptr] = self

    @property
    def is_non_blocking(self):
        return self._non_blocking

    def _enqueue(self, fn):
        """Queue device work; with nothing queued before, it runs at once."""
        if self._captured is not None:
            self._captured.append(fn)
            return
        with self._lock:
            if self._worker is not None and not self._worker.idle():
                self._worker.put(fn)
                return
        fn()

    def _enqueue_async(self, fn):
        """Work that may block (NCCL): always through this stream's worker thread."""
        if self._captured is not None:
            self._captured.append(fn)
            return
        with self._lock:
            if self._worker is None:
                self._worker = _double.Worker()
        self._worker.put(fn)

    def _order(self):
        """Host-side array work on this stream runs after what is queued (stream order)."""
        if self._worker is not None and not self._worker.idle():
            self._worker.drain()

    @property
    def done(self):
        return runtime.streamQuery(self.ptr) == 0

    def synchronize(self):
        _double.waited(self.ptr)
        runtime._check()
        if self._captured is not None:          # illegal while capturing; it ends the capture
            self._captured.invalid = True
            raise runtime.CUDARuntimeError(900)
        if self._worker is not None:
            self._worker.drain()
        runtime._check()
        _double.host_saw(self, self._tick, self._known)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        if event._stream is not None:
            for ptr, t in list(event._known.items()) + [(event._stream.ptr, event._tick)]:
                self._known[ptr] = max(self._known.get(ptr, 0), t)
        if not event.done:
            done = event._done
            self._enqueue_async(done.wait)

    # stream.pyx's capture (cudaStreamBeginCapture / EndCapture / IsCapturing): the work queued
    # meanwhile is recorded, not run; end_capture returns a cupy.cuda.graph.Graph that runs it
    # on the stream it is launched on. The double runs array math at once even while capturing
    # (it has no kernels to record): capture only NCCL calls and event records in tests.
    def begin_capture(self, mode=None):
        if self.ptr == 0 or self.ptr == 1:
            raise RuntimeError('cannot capture on the default (legacy) stream')
        runtime._check()
        if self._captured is not None:
            raise runtime.CUDARuntimeError(1)       # cudaStreamBeginCapture while capturing
        self._captured = graph._Work()

    def end_capture(self):
        runtime._check()
        work, self._captured = self._captured, None
        if work is None:
            raise runtime.CUDARuntimeError(401)     # cudaErrorIllegalState
        if work.invalid:
            raise runtime.CUDARuntimeError(901)
        return graph.Graph(work)

    def is_capturing(self):
        runtime._check()
        return self._captured is not None

    def use(self):
        device = _check_stream_device_match(self.device_id)
        _current().current[device] = self
        return self

    def __enter__(self):
        device = _check_stream_device_match(self.device_id)
        tls = _current()
        tls.stack.append((device, tls.current.get(device, Stream.null)))
        tls.current[device] = self
        return self

    def __exit__(self, *exc):
        tls = _current()
        device, previous = tls.stack.pop()
        tls.current[device] = previous


Stream.null = Stream(null=True)


def get_current_stream(device_id=-1):
    if device_id == -1:
        device_id = _double.current_device()
    return _current().current.get(device_id, Stream.null)


def stream_of(ptr):
    """The Stream behind a raw handle (the double's own lookup, used by its NCCL)."""
    return _streams.get(ptr)


from cupy.cuda import graph  # noqa: E402
from cupy.cuda import nccl  # noqa: E402,F401
