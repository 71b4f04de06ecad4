"""What issue 13's hostile inputs cost now: a legitimate client's round trip while 600
unauthenticated connections attack a pserver, the server's RSS and threads meanwhile; the
console follower on 128 MiB without a newline; --shuffle over one 64 MiB record.

    python bench/hardening.py
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import psutil  # noqa: E402

import pserverutil  # noqa: E402
from test_adversarial import (Attack, TOKEN, _big_header, _drip, _pserver_serves,  # noqa: E402
                              _silent, _rss_mib)


def attack(feed, name: str) -> None:
    port, = pserverutil.free_ports(1)
    endpoint = f"127.0.0.1:{port}"
    proc = pserverutil.start_pserver(0, [endpoint], trainers=1, token=TOKEN,
                                     args=["--no-state"],
                                     extra_env={"FLUIDCTL_HANDSHAKE_TIMEOUT": "2"})
    try:
        quiet = [_pserver_serves(endpoint) for _ in range(20)]
        before = _rss_mib(proc.pid)
        with Attack(port, n=600, sources=60, feed=feed) as a:
            while a.opened < 600:
                time.sleep(0.05)
            waits = [_pserver_serves(endpoint) for _ in range(20)]
            rss = _rss_mib(proc.pid)
            threads = psutil.Process(proc.pid).num_threads()
        print(f"{name:>7}: legit connect+stats median {statistics.median(quiet) * 1e3:.1f} ms "
              f"quiet, {statistics.median(waits) * 1e3:.1f} ms (max {max(waits) * 1e3:.1f}) "
              f"under attack; RSS {before:.0f} -> {rss:.0f} MiB; {threads} threads; "
              f"{a.opened} attack connections opened")
    finally:
        pserverutil.stop([proc])


def echo() -> None:
    from fluidctl.launch.echo import LogEcho
    from test_adversarial import _Counting
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "workerlog.0"
        with open(log, "wb") as f:
            for _ in range(128):
                f.write(b"y" * (1 << 20))
        start = time.monotonic()
        e = LogEcho([(str(log), "")], _Counting())
        e.start()
        e.finish()
        print(f"   echo: 128 MiB without a newline followed in {time.monotonic() - start:.2f} s")


def shuffle() -> None:
    from fluidctl import sharding
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.txt"
        data.write_bytes(b"a\nb\n" + b"x" * (64 << 20) + b"\nc\n")
        start = time.monotonic()
        sharding.shard(sharding.ShardOptions([str(data)], 2, os.path.join(tmp, "out"),
                                             shuffle=True, seed=1))
        print(f"shuffle: one 64 MiB record, --shuffle into 2 shards in "
              f"{time.monotonic() - start:.2f} s (peak RSS {psutil.Process().memory_info().rss >> 20} MiB)")


if __name__ == "__main__":
    for feed, name in ((_drip, "drip"), (_silent, "silent"), (_big_header, "big")):
        attack(feed, name)
    echo()
    shuffle()
