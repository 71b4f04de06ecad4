"""``fluidctl train --metrics-port PORT``: the job as Prometheus metrics, served by the launcher
with ``prometheus-client``.

A custom ``Collector`` builds every series from a ``snapshot.Reader`` at scrape time (the
launcher's in-memory live record and the events file): nothing is counted per step, and the
ranks are asked nothing. Labels: job, rank, node, world. No token for reads; the endpoint
binds to loopback unless ``--metrics-host`` says otherwise.
"""
from __future__ import annotations

from typing import Iterator, Tuple

from fluidctl.observe.snapshot import Reader

PREFIX = "fluidctl"


class JobCollector:
    """Every series of one job, read when Prometheus scrapes."""

    def __init__(self, reader: Reader):
        self.reader = reader

    def describe(self):
        return []           # unchecked collector: families come at collect time

    def collect(self) -> Iterator:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        snap = self.reader.read()
        job, world = str(snap["job"]), str(snap["world"])
        rank_labels = ["job", "rank", "node", "world"]
        step_time = HistogramMetricFamily(f"{PREFIX}_step_seconds",
                                          "Seconds per step (per collective under "
                                          "fluidctl.runtime) of each rank", labels=rank_labels)
        steps = CounterMetricFamily(f"{PREFIX}_steps", "Steps (collectives) each rank "
                                    "completed", labels=rank_labels)
        up = GaugeMetricFamily(f"{PREFIX}_rank_up", "1 while the rank runs, 0 once it ended "
                               "or its node is lost", labels=rank_labels)
        share = GaugeMetricFamily(f"{PREFIX}_step_share", "Share of a step in data loading, "
                                  "compute or communication (last seconds)",
                                  labels=rank_labels + ["kind"])
        slow = GaugeMetricFamily(f"{PREFIX}_straggler", "1 while a straggler verdict names "
                                 "the rank", labels=rank_labels)
        cpu = GaugeMetricFamily(f"{PREFIX}_rank_cpu_percent", "The rank's process: CPU% "
                                "since the last reading", labels=rank_labels)
        rss = GaugeMetricFamily(f"{PREFIX}_rank_rss_bytes", "The rank's process: resident "
                                "memory", labels=rank_labels)
        buckets = snap.get("buckets") or []
        for row in snap["ranks"]:
            labels = [job, str(row["rank"]), str(row["host"] or ""), world]
            hist = snap["histograms"].get(str(row["rank"]))
            if hist and buckets:
                counts, total, _ = hist
                cumulative, running = [], 0
                for bound, count in zip([*map(str, buckets), "+Inf"], counts):
                    running += count
                    cumulative.append((bound, running))
                step_time.add_metric(labels, cumulative, total)
            if row["step"] is not None:
                steps.add_metric(labels, row["step"])
            up.add_metric(labels, 1.0 if row["state"] == "running" else 0.0)
            for kind, value in (row["shares"] or {}).items():
                if value is not None:
                    share.add_metric(labels + [kind], value)
            slow.add_metric(labels, 1.0 if row["verdict"].startswith("slow") else 0.0)
            if row.get("cpu") is not None:
                cpu.add_metric(labels, row["cpu"])
            if row.get("rss") is not None:
                rss.add_metric(labels, row["rss"])
        yield from (step_time, steps, up, share, slow, cpu, rss)
        yield from self._job_series(snap, job, world)

    def _job_series(self, snap: dict, job: str, world: str) -> Iterator:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            SummaryMetricFamily)
        labels = ["job", "world"]
        events = snap["events"]
        for name, kind, text in (
                ("straggler_events", "straggler", "Straggler verdicts said"),
                ("restarts", "restart", "Restarts of the job"),
                ("lost_nodes", "node_lost", "Nodes lost (elastic jobs)"),
                ("checkpoint_commits", "checkpoint", "Checkpoints committed"),
                ("hangs", "hang", "Hangs the watchdog found")):
            family = CounterMetricFamily(f"{PREFIX}_{name}", text, labels=labels)
            family.add_metric([job, world], events.get(kind, 0))
            yield family
        seconds = snap["checkpoint"]["seconds"]
        took = SummaryMetricFamily(f"{PREFIX}_checkpoint_seconds",
                                   "Seconds a checkpoint took, first write to commit",
                                   labels=labels)
        took.add_metric([job, world], len(seconds), sum(seconds))
        yield took
        watchdog = GaugeMetricFamily(f"{PREFIX}_hang_watchdog", "The hang watchdog: 0 off, "
                                     "1 watching, 2 a hang found", labels=labels)
        watchdog.add_metric([job, world], 2.0 if snap["hang"] else
                            1.0 if snap.get("hang_timeout") else 0.0)
        yield watchdog
        for name, value, text in (("attempt", snap["attempt"], "The job's attempt (1: first)"),
                                  ("world_size", snap["world"], "Ranks in the world now"),
                                  ("steps_per_second", snap["steps_per_s"],
                                   "The job's pace: the slowest running rank's steps/s")):
            if value is not None:
                family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["job"])
                family.add_metric([job], value)
                yield family


class Server:
    """The endpoint: prometheus-client's HTTP server on its own registry."""

    def __init__(self, reader: Reader, host: str, port: int):
        from prometheus_client import CollectorRegistry, start_http_server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JobCollector(reader))
        self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        self.address: Tuple[str, int] = self.server.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

