"""What ``fluidctl cluster check --deep`` runs on each node: ``python -m fluidctl.node.healthprobe``,
one JSON request per line on stdin, one JSON answer per line on stdout, until EOF.

Requests (``op``):
  ``cpu``     CPU GEMM GFLOP/s (numpy, float64 256x256, one thread) and memory bandwidth GB/s
              (numpy copy of 32 MiB), each over a fixed time (``seconds``, 0.15 s)
  ``disk``    free bytes in ``dir`` and its write speed (``mib`` MiB written, fsync'd, removed)
  ``listen``  open a TCP port on every address; answers ``{"port": P}`` at once; the first
              connection is read for ``seconds`` from its first byte, then reset
  ``received``  wait for that connection's figure: ``{"gbps": ...}``
  ``send``    connect to ``host``:``port`` and send until the peer resets (or ``seconds`` + 2)
  ``gpu``     CuPy GEMM TFLOP/s on each GPU and a one-node NCCL allreduce; ``skipped`` says why
              not (no CuPy, no GPU, no NCCL)
Every answer carries ``error`` instead when the measurement failed. Where it may (as root),
the probe raises its own priority (nice -15): a busy but healthy node still gives it a core,
a node whose CPU is throttled (a cgroup quota, a thermal limit) does not. Light on purpose: no
fluidctl import beyond this module, numpy and CuPy only when asked.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 18                             # 256 KiB per send/recv
BUFFER = 1 << 20                            # socket buffers: a capped link drains quickly


def cpu(seconds: float = 0.25, mem_seconds: float = 0.15) -> dict:
    try:
        import numpy as np
    except ImportError:
        return {"skipped": "numpy not installed"}
    n = 256
    a = np.random.default_rng(0).random((n, n))
    b = a.T.copy()
    out = np.empty_like(a)
    np.matmul(a, b, out=out)                # warm
    count, start = 0, time.perf_counter()
    while True:
        np.matmul(a, b, out=out)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    gflops = 2 * n ** 3 * count / elapsed / 1e9
    src = np.ones(1 << 22)                  # 32 MiB of float64
    dst = np.empty_like(src)
    np.copyto(dst, src)
    count, start = 0, time.perf_counter()
    while True:
        np.copyto(dst, src)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= mem_seconds:
            break
    return {"gemm_gflops": gflops, "mem_gbps": 2 * src.nbytes * count / elapsed / 1e9}


def disk(directory: str, mib: int = 16) -> dict:
    directory = os.path.expanduser(directory or "~")
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    path = os.path.join(directory, f".fluidctl-health-{os.getpid()}")
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        elapsed = time.perf_counter() - start
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"disk_free": free, "write_mbps": mib * (1 << 20) / elapsed / 1e6}


class Receiver:
    """One listening socket; the first connection is read for ``seconds`` from its first
    byte, then reset, so a slow link costs no more than a fast one."""

    def __init__(self, seconds: float, accept_timeout: float):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
        self.sock.bind(("", 0))
        self.sock.listen(1)
        self.sock.settimeout(accept_timeout)
        self.seconds = seconds
        self.result: dict = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _run(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError as exc:
            self.result = {"error": f"no peer connected: {exc}"}
            return
        finally:
            self.sock.close()
        buf = bytearray(CHUNK)
        total, start = 0, None
        conn.settimeout(self.seconds + 2)
        try:
            while True:
                got = conn.recv_into(buf)
                if not got:
                    break
                now = time.perf_counter()
                if start is None:
                    start = now
                    continue                # the clock starts at the first byte
                total += got
                if now - start >= self.seconds:
                    break
        except OSError as exc:
            self.result = {"error": f"receiving: {exc}"}
        finally:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()                    # a reset: the sender stops at once
        if not self.result:
            elapsed = (time.perf_counter() - start) if start is not None else 0.0
            self.result = ({"gbps": total * 8 / elapsed / 1e9} if elapsed > 0
                           else {"error": "no bytes arrived"})


def send(host: str, port: int, seconds: float) -> dict:
    block = b"\0" * CHUNK
    deadline = time.monotonic() + seconds + 2
    sent = 0
    try:
        sock = socket.create_connection((host, port), timeout=2)
    except OSError as exc:
        return {"error": f"cannot connect to {host}:{port}: {exc}"}
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    sock.settimeout(seconds + 2)
    try:
        while time.monotonic() < deadline:
            sock.sendall(block)
            sent += len(block)
    except OSError:
        pass                                # the receiver reset it: done
    finally:
        sock.close()
    return {"sent": sent}


def gpu(seconds: float = 0.25) -> dict:
    import glob
    if not glob.glob("/dev/nvidia[0-9]*"):      # CuPy's import alone costs seconds
        return {"skipped": "no GPU"}
    try:
        import cupy
    except ImportError:
        return {"skipped": "CuPy not installed"}
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDA's errors name the cause
        return {"skipped": f"no usable GPU ({exc})"}
    if count == 0:
        return {"skipped": "no GPU"}
    found: dict = {"gpus": count, "gemm_tflops": []}
    n = 4096
    for device in range(count):
        with cupy.cuda.Device(device):
            a = cupy.ones((n, n), dtype=cupy.float32)
            out = a @ a
            cupy.cuda.Device(device).synchronize()
            runs, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                cupy.matmul(a, a, out=out)
                runs += 1
                if runs % 4 == 0:
                    cupy.cuda.Device(device).synchronize()
            cupy.cuda.Device(device).synchronize()
            found["gemm_tflops"].append(2 * n ** 3 * runs / (time.perf_counter() - start) / 1e12)
    found.update(_allreduce(cupy, count, seconds))
    return found


def _allreduce(cupy, count: int, seconds: float) -> dict:
    """A one-node NCCL allreduce of 64 MiB per GPU over every GPU: bus bandwidth GB/s."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        return {"nccl_skipped": "CuPy has no NCCL"}
    if not getattr(nccl, "available", True):
        return {"nccl_skipped": "CuPy has no NCCL"}
    try:
        comms = nccl.NcclCommunicator.initAll(list(range(count)))
        bufs = []
        for device in range(count):
            with cupy.cuda.Device(device):
                bufs.append(cupy.ones(1 << 24, dtype=cupy.float32))

        def once():
            nccl.groupStart()
            for comm, buf in zip(comms, bufs):
                with cupy.cuda.Device(comm.device_id()):
                    comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, nccl.NCCL_FLOAT32,
                                   nccl.NCCL_SUM, cupy.cuda.Stream.null.ptr)
            nccl.groupEnd()
            for device in range(count):
                cupy.cuda.Device(device).synchronize()
        once()
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            once()
            runs += 1
        elapsed = time.perf_counter() - start
        if count == 1:      # nothing crosses a link: NCCL works, there is no bandwidth
            return {"nccl_skipped": f"one GPU: the allreduce ran ({elapsed / runs * 1e6:.0f} "
                                    "us a call), no link to measure"}
        algbw = bufs[0].nbytes * runs / elapsed / 1e9
        return {"nccl_busbw_gbps": algbw * 2 * (count - 1) / count}
    except Exception as exc:  # noqa: BLE001 - NCCL's errors name the cause
        return {"nccl_error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}


def answer(request: dict, state: dict) -> dict:
    op = request.get("op")
    if op == "cpu":
        return cpu(float(request.get("seconds", 0.25)), float(request.get("mem_seconds", 0.15)))
    if op == "disk":
        return disk(request.get("dir") or "~", int(request.get("mib", 16)))
    if op == "listen":
        receiver = Receiver(float(request.get("seconds", 0.5)),
                            float(request.get("accept_timeout", 5)))
        state["receiver"] = receiver
        return {"port": receiver.port}
    if op == "received":
        receiver = state.pop("receiver", None)
        if receiver is None:
            return {"error": "nothing was listening"}
        receiver.thread.join(receiver.seconds + 8)
        return receiver.result or {"error": "the transfer did not end"}
    if op == "send":
        return send(request["host"], int(request["port"]), float(request.get("seconds", 0.5)))
    if op == "gpu":
        return gpu(float(request.get("seconds", 0.25)))
    return {"error": f"unknown request {op!r}"}


def main(argv=None) -> int:
    import signal
    argv = sys.argv[1:] if argv is None else argv
    # a hard bound on its life: a lost launcher never leaves a probe behind
    signal.alarm(int(argv[0]) if argv else 120)
    state: dict = {}
    try:        # where allowed (root), measure what the node offers, not its neighbours' load
        os.setpriority(os.PRIO_PROCESS, 0, -15)
    except OSError:
        pass
    try:
        import numpy  # noqa: F401 - imported now, on every node at once, not while measuring
    except ImportError:
        pass
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = answer(json.loads(line), state)
        except Exception as exc:  # noqa: BLE001 - one failed measurement, not the probe
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
