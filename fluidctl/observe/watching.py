"""What a launcher runs so that its job can be watched: the ``live.Publisher`` (live.json for
``fluidctl top``) and, with ``--metrics-port``, the metrics endpoint. The endpoint binds
before the job starts (a port in use is one line, exit 2); the publisher starts with the
supervisor (``attach``) and both stop when the job ends (``close``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from fluidctl.errors import UsageError
from fluidctl.observe.live import Publisher


class Watching:
    def __init__(self, log_root: Path, meta: dict, metrics_host: str = "127.0.0.1",
                 metrics_port: Optional[int] = None):
        self.log_root, self.meta = Path(log_root), dict(meta)
        self.publisher: Optional[Publisher] = None
        self.server = None
        if metrics_port is not None:
            try:
                import prometheus_client  # noqa: F401
            except ImportError:
                raise UsageError("--metrics-port needs prometheus-client",
                                 "pip install 'fluidctl[metrics]'") from None
            from fluidctl.observe.metrics import Server
            from fluidctl.observe.snapshot import Reader
            try:
                self.server = Server(Reader(self.log_root, live=self.state),
                                     metrics_host, metrics_port)
            except OSError as exc:
                raise UsageError(f"cannot serve metrics on {metrics_host}:{metrics_port}: "
                                 f"{exc.strerror or exc}",
                                 "choose another --metrics-port (0 picks a free one) or "
                                 "--metrics-host") from None
            self.meta["metrics"] = self.server.url

    @property
    def url(self) -> Optional[str]:
        return self.server.url if self.server else None

    def state(self) -> Optional[dict]:
        """The launcher's live record now (None before the first reading)."""
        return (self.publisher.state() or None) if self.publisher else None

    def attach(self, diagnostics, handles: Callable[[], list]) -> None:
        """Start publishing once the supervisor exists (``handles``: its running attempt)."""
        def pids():
            return {rank: pid for rank, (_, pid) in diagnostics.diag.ranks().items()}
        self.publisher = Publisher(diagnostics.step_samples, diagnostics.hosts, handles,
                                   self.log_root, self.meta, pids=pids,
                                   usage=diagnostics.usage)
        self.publisher.publish()            # live.json from the start: top sees a job at once
        self.publisher.start()

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        if self.server is not None:
            self.server.close()
