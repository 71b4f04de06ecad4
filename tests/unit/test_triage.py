"""The triage engine on recorded text (kernel OOM records, NCCL errors, tracebacks); a real OOM
kill is tests/e2e/test_triage_oom.py."""

import pytest

from fluidctl.diagnostics import triage

# recorded on this machine (cgroup v1, kernel 6.x): `dmesg` after a worker hit a 100 MB limit
DMESG = """\
[ 1853.055504] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[ 1853.072110] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/fluidctl-i14-probe,task_memcg=/fluidctl-i14-probe,task=python3,pid=8441,uid=0
[ 1853.072147] Memory cgroup out of memory: Killed process 8441 (python3) total-vm:114244kB, anon-rss:102004kB, file-rss:6624kB, shmem-rss:0kB, UID:0 pgtables:264kB oom_score_adj:0
"""
# the same record as /dev/kmsg gives it, and a whole-machine OOM of an older kernel
KMSG = ("6,2001,1853072147,-;Memory cgroup out of memory: Killed process 8441 (python3) "
        "total-vm:114244kB, anon-rss:102004kB, file-rss:6624kB, shmem-rss:0kB, UID:0\n")
GLOBAL = ("[  99.1] Out of memory: Kill process 77 (python) score 901 or sacrifice child\n"
          "[  99.2] Killed process 77 (python) total-vm:9000000kB, anon-rss:7340032kB, "
          "file-rss:0kB, shmem-rss:0kB\n")


def test_oom_records_from_dmesg_kmsg_and_older_kernels():
    (r,) = triage.oom_records(DMESG)
    assert (r.pid, r.comm, r.cgroup, r.uptime) == (8441, "python3", True, 1853.072147)
    assert r.rss_bytes == (102004 + 6624) * 1024
    (k,) = triage.oom_records(KMSG)
    assert (k.pid, k.uptime, k.rss_bytes) == (8441, 1853.072147, r.rss_bytes)
    (g,) = triage.oom_records(GLOBAL)
    assert (g.pid, g.cgroup, g.rss_bytes) == (77, False, 7340032 * 1024)


def test_sigkill_with_the_kernel_record_of_that_pid_is_memory():
    recs = triage.oom_records(DMESG)
    e = triage.explain(-9, [], pid=8441, oom=recs)
    assert e.kind == "oom"
    assert "killed for memory" in e.text and "it used 106.1 MiB when" in e.text
    assert "memory cgroup" in e.text and "Killed process 8441 (python3)" in e.text
    other = triage.explain(-9, [], pid=8442, oom=recs)       # another pid: just SIGKILL
    assert other.kind == "signal" and "SIGKILL" in other.text


def test_cgroup_oom_kill_counter_v2_and_v1(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 3\n")
    (v2 / "memory.max").write_text("2147483648\n")
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert triage.oom_kill_count(v2) == 3 and triage.memory_limit(v2) == 2147483648
    assert triage.oom_kill_count(v1) == 1 and triage.memory_limit(v1) is None
    assert triage.oom_kill_count(tmp_path / "none") is None
    e = triage.explain(137, [], pid=5, cgroup_oom_kills=1, cgroup_limit=2147483648)
    assert e.kind == "oom" and "limit of 2.0 GiB" in e.text and "+1" in e.text


def test_this_process_memory_cgroup_is_found():
    path = triage.memory_cgroup()
    if path is None:
        pytest.skip("no memory cgroup visible here")
    assert triage.oom_kill_count(path) is not None


@pytest.mark.parametrize("line, cls", [
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
     "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "ncclSystemError"),
    ("torch.distributed.DistBackendError: NCCL error ... ncclRemoteError: A call failed "
     "possibly due to a network error or a remote process exiting prematurely.",
     "ncclRemoteError"),
    ("cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_UNHANDLED_CUDA_ERROR: unhandled cuda "
     "error", "ncclUnhandledCudaError"),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
     "OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600512 milliseconds",
     "NCCL timeout"),
    ("NCCL WARN Error : ring 0 does not loop back; invalid usage (run with NCCL_DEBUG=WARN "
     "for details)", "ncclInvalidUsage"),
])
def test_nccl_error_classes(line, cls):
    found = triage.nccl_error(["step 10", line, "exiting"])
    assert found and found.startswith(cls + ":")


def test_no_nccl_class_in_an_ordinary_log():
    assert triage.nccl_error(["epoch 1 loss 0.3", "internal error counter 0"]) is None


TRACEBACK = """\
step 3
Traceback (most recent call last):
  File "/job/train.py", line 40, in <module>
    main()
  File "/job/data.py", line 12, in load
    raise ValueError("shard 3 has 0 records")
ValueError: shard 3 has 0 records
""".splitlines()


def test_python_exception_type_message_and_place():
    exc = triage.python_exception(TRACEBACK)
    assert (exc.type, exc.message, exc.where) == ("ValueError", "shard 3 has 0 records",
                                                  "data.py:12")
    e = triage.explain(1, TRACEBACK)
    assert e.kind == "exception"
    assert e.text == "ValueError: shard 3 has 0 records (at data.py:12)"


def test_chained_tracebacks_take_the_last_and_dotted_types():
    lines = TRACEBACK + ["", "During handling of the above exception, another exception "
                         "occurred:", "", "Traceback (most recent call last):",
                         '  File "/job/train.py", line 44, in <module>',
                         "    fail()",
                         "fluidctl.runtime.collective.meta.CollectiveError: rank 1 (pid 7, "
                         "same node) died during a collective"]
    exc = triage.python_exception(lines)
    assert exc.type == "fluidctl.runtime.collective.meta.CollectiveError"
    assert exc.message.startswith("rank 1 (pid 7") and exc.where == "train.py:44"
    assert triage.python_exception(["KeyboardInterrupt"]) is None      # no traceback: none


def test_nccl_comes_with_the_exception_that_raised_it():
    lines = ["Traceback (most recent call last):", '  File "t.py", line 9, in <module>',
             "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"]
    e = triage.explain(1, lines)
    assert e.kind == "nccl" and "ncclSystemError" in e.text and "raised as RuntimeError" in e.text


@pytest.mark.parametrize("code, words", [(-11, "SIGSEGV: segmentation fault"),
                                         (-7, "SIGBUS"), (139, "SIGSEGV"),
                                         (-9, "SIGKILL: the OOM killer, a scheduler")])
def test_signals_are_named_and_explained(code, words):
    e = triage.explain(code, ["no traceback here"])
    assert e.kind == "signal" and words in e.text


def test_plain_exit_code():
    e = triage.explain(3, ["bye"])
    assert (e.kind, e.text) == ("exit", "exit code 3 (no traceback in its log)")


def test_kernel_log_is_read_here_or_none():
    text = triage.kernel_log()
    assert text is None or isinstance(text, str)




