"""The whole shard-data run: check options and inputs, build every shard inside the staging
directory (plan and copy, or shuffle; then equalize), write the manifest last, rename into place."""
from __future__ import annotations

import os

from fluidctl.errors import UsageError
from fluidctl.shardlayout import MANIFEST_NAME, shard_name
from fluidctl.sharding.copy import ShardWriter
from fluidctl.sharding.inputs import (Source, check_out_dir, default_name, open_sources,
                                      resolve_inputs, validate_jsonl)
from fluidctl.sharding.manifest import _manifest, to_json
from fluidctl.sharding.options import Progress, ShardOptions, ShardResult, check_options
from fluidctl.sharding.parallel import _parallel
from fluidctl.sharding.plan import Segment, Stream, make_spans, plan_files, plan_lines
from fluidctl.sharding.staging import Staging, _check_space, _io_error

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from fluidctl.sharding.parallel import StopFlag
    from typing import Callable, List, Optional, Sequence, Tuple


def _load_numpy(opts: ShardOptions) -> None:
    """numpy (and numpy.random, which numpy loads lazily) for the paths that need it, imported
    before any work starts: an import in progress swallows a Ctrl-C (the run would then finish
    as if never interrupted), and the default path on small inputs should not pay for it."""
    if opts.shuffle or opts.equalize != "none" or opts.canonical:
        # numpy's BLAS threads would only compete with the copy threads for cores
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if opts.shuffle or opts.equalize != "none":
        import numpy.random  # noqa: F401
        import fluidctl.sharding.equalize  # noqa: F401
        import fluidctl.sharding.shuffle  # noqa: F401
    if opts.canonical:                  # the record-offset index beside each shard
        import fluidctl.runtime.recordindex  # noqa: F401
        import fluidctl.sharding.offsets  # noqa: F401


def shard(opts: ShardOptions, progress: Optional[Progress] = None) -> dict:
    """Run shard-data; returns the manifest (also written to OUT_DIR/manifest.json)."""
    progress = progress or Progress()
    check_options(opts)
    _load_numpy(opts)
    files, dirs = resolve_inputs(opts.inputs)
    check_out_dir(opts.out_dir, files, dirs, opts.force)
    name = opts.name or default_name(files[0])
    with Staging(opts.out_dir) as stage:
        try:
            sources, results = _build(opts, files, name, stage, progress)
            if opts.canonical:
                from fluidctl.sharding.offsets import with_indexes
                results = with_indexes(results, stage.tmp,
                                       1 if opts.format == "csv" else 0, opts.checksum)
            manifest = _manifest(opts, name, results, sources)
            with open(stage.path(MANIFEST_NAME), "w") as f:     # written last
                f.write(to_json(manifest) + "\n")                # as json.dump(indent=2)
            stage.commit(opts.force)
        except OSError as exc:
            raise _io_error(exc, opts.out_dir, stage.tmp) from None
    return manifest


def _build(opts: ShardOptions, files: List[str], name: str, stage: Staging,
           progress: Progress) -> Tuple[List[Source], List[ShardResult]]:
    sources = open_sources(files, opts.format, stage.work, progress)
    if opts.format == "jsonl":
        validate_jsonl(sources, progress)
    header = sources[0].header if opts.format == "csv" else b""
    file_names = [shard_name(name, i, opts.suffix_length) for i in range(opts.trainers)]

    def new_writer(i: int) -> ShardWriter:
        return ShardWriter(stage.path(file_names[i]), opts.checksum, progress)

    def make_writer(i: int) -> ShardWriter:
        writer = new_writer(i)
        writer.create()
        if header:
            writer.write(header)
        return writer

    if opts.shuffle or opts.equalize == "pad":
        import numpy as np
        seeds = np.random.SeedSequence(opts.seed).spawn(2)
    if opts.shuffle:
        from fluidctl.sharding.shuffle import shuffle_shards
        total = sum(s.data_bytes for s in sources)
        _check_space(stage.tmp, opts.out_dir, 2 * total)
        writers = shuffle_shards(sources, opts, stage.work, make_writer, progress,
                                 np.random.default_rng(seeds[0]))
    else:
        stream = Stream(sources, make_spans(sources))
        if opts.by == "lines":
            plans = plan_lines(stream, opts.trainers, opts.count_flag)
        else:
            plans = plan_files(stream, sources, opts.trainers, opts.count_flag)
        if opts.equalize == "truncate":
            from fluidctl.sharding.equalize import count_plan, truncate_plan
            progress.stage("counting records", stream.length)
            counts = [count_plan(sources, p) for p in plans]
            keep = min(counts)
            plans = [truncate_plan(sources, p, keep) if c > keep else p
                     for p, c in zip(plans, counts)]
        size = sum(s.length for p in plans for s in p) + len(header) * opts.trainers
        _check_space(stage.tmp, opts.out_dir, size)
        writers = _write_plans(plans, sources, new_writer, header, progress, size)
    header_lines = 1 if header else 0
    if opts.equalize == "pad":
        from fluidctl.sharding.equalize import pad_shard
        pad_rngs = [np.random.default_rng(s) for s in seeds[1].spawn(opts.trainers)]
        most = max(w.records for w in writers)
        progress.stage("padding", sum(w.bytes for w in writers if w.records < most))

        def pad(i: int, stop: StopFlag) -> None:
            w = writers[i]
            if w.records < most:
                w.fd = os.open(w.path, os.O_WRONLY)
                os.lseek(w.fd, 0, os.SEEK_END)
                try:
                    pad_shard(w, header_lines, most - w.records, pad_rngs[i], progress)
                finally:
                    w.close()

        _parallel(pad, len(writers))
    return sources, [ShardResult(i, file_names[i], w.records - header_lines, w.bytes, w.digest)
                     for i, w in enumerate(writers)]


def _write_plans(plans: List[List[Segment]], sources: Sequence[Source],
                 new_writer: Callable[[int], ShardWriter], header: bytes, progress: Progress,
                 size: int) -> List[ShardWriter]:
    """Write every shard from its byte ranges: for each shard one task appends (the kernel
    copies) and another tallies (reads, hashes, counts), spread over a thread per core."""
    progress.stage("writing shards", size)
    before = [_identity(s.path) for s in sources]
    writers = [new_writer(i) for i in range(len(plans))]

    def work(task: int, stop: StopFlag) -> None:
        i, tallying = divmod(task, 2)
        writer = writers[i]
        if tallying:
            piece, byte_range = writer.tally, writer.tally_range
        else:
            writer.create()
            piece, byte_range = writer.append, writer.append_range
        try:
            piece(header)
            for seg in plans[i]:
                if seg.src < 0:
                    piece(seg.data)
                else:
                    byte_range(sources[seg.src].path, seg.start, seg.end, stop)
        finally:
            if not tallying:
                writer.close()

    _parallel(work, 2 * len(plans))
    for src, seen in zip(sources, before):
        if _identity(src.path) != seen:      # the copy and the tally may have read different bytes
            raise UsageError(f"input {src.display} changed while being sharded",
                             "do not modify the inputs while shard-data runs, then run it again")
    return writers


def _identity(path: str) -> Tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
