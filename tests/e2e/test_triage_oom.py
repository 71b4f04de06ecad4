"""A real OOM kill in a memory-limited cgroup is recognised from the kernel record (where this
machine allows creating one)."""
import os
import subprocess
import sys

import pytest

from fluidctl.diagnostics import triage

from cgroups import make_memory_cgroup  # noqa: E402


def test_a_real_oom_kill_is_recognised_from_the_kernel_record():
    cgroup = make_memory_cgroup(64 << 20)
    if cgroup is None:
        pytest.skip("cannot create a memory-limited cgroup here")
    try:
        before = triage.oom_kill_count(cgroup)
        code = ("import os,sys; open(sys.argv[1] + '/cgroup.procs','w').write(str(os.getpid()))\n"
                "x = []\nwhile True: x.append(bytearray(8 << 20))\n")
        proc = subprocess.Popen([sys.executable, "-c", code, str(cgroup)])
        assert proc.wait(timeout=60) == -9
        recs = triage.oom_records(triage.kernel_log() or "")
        e = triage.explain(proc.returncode, [], pid=proc.pid, oom=recs,
                           cgroup_oom_kills=triage.oom_kill_count(cgroup) - before)
        assert e.kind == "oom", e.text
        if any(r.pid == proc.pid for r in recs):
            assert f"Killed process {proc.pid}" in e.text
    finally:
        os.rmdir(cgroup)
