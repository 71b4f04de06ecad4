"""A memory-limited cgroup for the real OOM tests (tests/e2e/test_triage_oom.py,
tests/e2e/test_diagnose.py)."""
import uuid
from pathlib import Path


def make_memory_cgroup(limit: int):
    """A cgroup v1 memory controller child with ``limit``, or None where not allowed."""
    root = Path("/sys/fs/cgroup/memory")
    path = root / f"fluidctl-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(limit))
        try:
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            pass
    except OSError:
        try:
            path.rmdir()
        except OSError:
            pass
        return None
    return path
