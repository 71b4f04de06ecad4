"""Sizes the engine's speed and memory depend on, in one place.

The other modules read them as ``tuning.NAME`` at call time (never copied at import), so a test
or benchmark can change one -- ``fluidctl.sharding.tuning.BLOCK = 64`` -- and the whole engine
follows.
"""

BLOCK = 1 << 20                    # read buffer per worker thread (scans, inputs)
COPY_BLOCK = 256 << 10             # a shard is read (to hash and count it) in pieces this large:
                                   # each is hashed and counted while in the CPU's cache
KERNEL_COPY_BLOCK = 16 << 20       # bytes per copy_file_range call (a stop is seen between calls)
SNIFF = 64 << 10                   # bytes looked at to decide "binary"; newline search step
BUCKET_MAX_BYTES = 4 << 20         # a shuffle bucket is shuffled in memory up to this size...
BUCKET_MAX_RECORDS = 128 << 10     # ...and this many records; beyond, it is scattered again
MAX_BUCKETS = 512                  # bucket files per scatter level (ids fit numpy's uint16)
SCATTER_BLOCK = 256 << 10          # input read per scatter step (Python objects: ~8x this)
SCATTER_BUFFER = 4 << 20           # buffered bucket bytes, all buckets together
JOIN_RECORDS = 8192                # records joined per write into a shard
NUMPY_FROM = 64 << 10              # without StringZilla, a loaded numpy counts newlines in
                                   # buffers this large (smaller ones: bytes.count)
STRINGZILLA_FROM = 1 << 20         # StringZilla (an import) is loaded once this many bytes
                                   # were counted without it: a small run never imports it
