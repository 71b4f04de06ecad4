"""The one-GPU check (run it through tests/gpu/one_gpu_check.sh): everything fluidctl's GPU path
promises that one H100/H200 can show in about ten minutes, written step by step to a report.

    tests/gpu/one_gpu_check.sh [REPORT]          # real GPU: $OUT/gpu-check.txt by default
    tests/gpu/one_gpu_check.sh --double [REPORT] # dry run here, against tests/cupy_double

Steps (each a PASS / FAIL / SKIP line with its seconds, failures with their output's tail):
versions; one rank: every collective x dtype, stream order, host waits; two ranks on the one
GPU without NCCL_MULTI_RANK_GPU_ENABLE fail fast with one message; with NCCL >= 2.30 and
NCCL_MULTI_RANK_GPU_ENABLE=1: every collective and dtype (bfloat16 too), DistributedOptimizer
with both strategies, a rank that never launches (abort within timeout + 2 s), a rank killed
inside its NCCL call (seen within 2 s), templates/train_nccl2.py; bench/gpu_allreduce.py
(fluidctl vs torch NCCL); then ``pytest -m gpu``. Runs from the working tree (PYTHONPATH),
installs nothing, reaches no network.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DOUBLE_DIR = os.path.join(ROOT, "tests", "cupy_double")
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

DOUBLE = os.environ.get("FLUIDCTL_GPU_CHECK_DOUBLE") == "1"
TIMEOUT = int(os.environ.get("FLUIDCTL_GPU_CHECK_TIMEOUT", "20"))  # the failure steps'
NEEDED = ("numpy", "msgpack", "click", "rich", "psutil", "hostlist", "xxhash", "blake3",
          "stringzilla", "paramiko", "fabric", "pytest", "ml_dtypes")


class Report:
    def __init__(self, path: str):
        self.path = path
        self.lines = []
        self.counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def write(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)
        tmp = self.path + ".part"
        with open(tmp, "w") as f:                 # the report is whole at every step
            f.write("\n".join(self.lines) + "\n")
        os.replace(tmp, self.path)

    def step(self, name: str, fn) -> None:
        start = time.monotonic()
        try:
            verdict, detail = fn()
        except Exception as exc:                  # a broken step says why and the next runs
            verdict, detail = "FAIL", f"{type(exc).__name__}: {exc}"
        self.counts[verdict] += 1
        head, _, rest = str(detail).partition("\n")
        self.write(f"{verdict:4}  {name}  ({time.monotonic() - start:.1f} s)  {head}")
        if rest.strip():
            self.write("\n".join("      " + l for l in rest.rstrip().splitlines()[-40:]))


def base_env(extra=None) -> dict:
    env = dict(os.environ)
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)   # carried packages
            if p and p not in (DOUBLE_DIR, ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(([DOUBLE_DIR] if DOUBLE else []) + [ROOT] + kept)
    env.setdefault("FLUIDCTL_TIMEOUT", "120")
    env.pop("NCCL_MULTI_RANK_GPU_ENABLE", None)
    env.update(extra or {})
    return env


def run(argv, extra=None, timeout=300):
    return subprocess.run(argv, cwd=ROOT, env=base_env(extra), capture_output=True, text=True,
                          timeout=timeout)


def tail(text: str, n: int = 3000) -> str:
    return text[-n:]


def python_facts() -> dict:
    code = r"""
import json, platform, sys
out = {"python": sys.version.split()[0], "machine": platform.machine()}
try:
    import cupy
    from cupy.cuda import nccl, runtime
    out["cupy"] = cupy.__version__
    out["cuda_runtime"] = runtime.runtimeGetVersion()
    out["nccl_available"] = bool(nccl.available)
    out["nccl"] = nccl.get_version() if nccl.available else 0
    try:
        out["gpus"] = runtime.getDeviceCount()
        out["gpu0_pci"] = cupy.cuda.Device(0).pci_bus_id
    except Exception as exc:
        out["gpu_error"] = str(exc)
except Exception as exc:
    out["cupy_error"] = f"{type(exc).__name__}: {exc}"
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["torch_gpu"] = torch.cuda.is_available()
    out["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if out["torch_gpu"] else ""
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    import ml_dtypes
    out["ml_dtypes"] = ml_dtypes.__version__
except Exception:
    out["ml_dtypes"] = ""
missing = []
for name in %r:
    try:
        __import__(name)
    except Exception:
        missing.append(name)
out["missing_modules"] = missing
print(json.dumps(out))
""" % (NEEDED,)
    res = run([sys.executable, "-c", code], timeout=180)
    if res.returncode != 0:
        return {"error": tail(res.stderr)}
    return json.loads(res.stdout.strip().splitlines()[-1])


def rank_results_from_logs(log_dir: str, n: int):
    out = []
    for r in range(n):
        path = os.path.join(log_dir, f"workerlog.{r}")
        text = open(path, errors="replace").read() if os.path.exists(path) else ""
        lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
        out.append(json.loads(lines[-1][7:]) if lines else None)
    return out


def train(tmp: str, name: str, args, extra=None, timeout=300):
    log = os.path.join(tmp, name)
    res = run([sys.executable, "-m", "fluidctl", "train", "--tee", "all", "--log-dir", log,
               *args], extra=extra, timeout=timeout)
    return res, log


def one_rank(tmp, scenario):
    def step():
        res, log = train(tmp, f"one-{scenario}", ["--gpus", "1", "tests/gpu_worker.py",
                                                  scenario])
        if res.returncode != 0:
            return "FAIL", f"exit {res.returncode}\n{tail(res.stdout + res.stderr)}"
        out = rank_results_from_logs(log, 1)[0] or {}
        bad = out.get("errors") or ([] if out.get("ok", True) else [out])
        if scenario == "host_waits" and not (out.get("caller") == 0 and out.get("total") == 0):
            bad = [out]                                   # 0 host waits of any kind
        return ("FAIL", json.dumps(out)) if bad else ("PASS", json.dumps(out)[:300])
    return step


def shared_ranks(tmp, argv, n=2, extra=None, timeout=240, until=None):
    """``n`` ranks all on the one GPU (the first nvidia-smi lists), started by hand."""
    import rankspawn
    gpu = os.environ.get("FLUIDCTL_GPU_CHECK_ID", "0")
    envs = rankspawn.rank_envs(n, gpus=[str(i) for i in range(n)],
                               extra={"FLUIDCTL_TIMEOUT": str(TIMEOUT), **(extra or {})})
    for env in envs:
        env.update(base_env({"FLUIDCTL_TIMEOUT": str(TIMEOUT), **(extra or {})}))
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env["FLAGS_selected_gpus"] = env["PADDLE_LOCAL_DEVICE_IDS"] = "0"
        env["PADDLE_WORLD_DEVICE_IDS"] = ",".join(["0"] * n)
    work = tempfile.mkdtemp(dir=tmp)
    return rankspawn.Ranks(argv, envs, work).wait(timeout, until=until)


def results_of(res):
    import rankspawn
    return rankspawn.results(res)


def first_result(text: str):
    """A rank's first RESULT line (scenarios that print more than one)."""
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


OPT_IN = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--double"]
    out_dir = os.environ.get("OUT") or "."
    path = os.path.abspath(args[0] if args else os.path.join(out_dir, "gpu-check.txt"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rep = Report(path)
    tmp = tempfile.mkdtemp(prefix="fluidctl-gpu-check-")
    rep.write(f"fluidctl one-GPU check, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
              f"{'DRY RUN against tests/cupy_double (no real GPU)' if DOUBLE else 'real GPU'}")
    git = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %s"],
                         capture_output=True, text=True)
    rep.write(f"tree: {ROOT} ({git.stdout.strip() or 'not a git checkout'})")

    # --- versions ----------------------------------------------------------------------
    facts = python_facts()
    smi = shutil.which("nvidia-smi")
    smi_out = subprocess.run([smi, "--query-gpu=index,name,driver_version,pci.bus_id,"
                              "memory.total", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip() if smi else "no nvidia-smi"
    rep.write("versions: " + json.dumps(facts))
    rep.write("nvidia-smi: " + (smi_out or "lists no GPU"))
    if facts.get("missing_modules"):
        rep.write("missing Python modules (fluidctl runs from this tree, its dependencies must "
                  "be installed: pip install click rich psutil msgpack python-hostlist xxhash "
                  "blake3 'stringzilla<6' paramiko fabric pytest ml_dtypes): "
                  + ", ".join(facts["missing_modules"]))
    for k in ("NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "CUDA_VISIBLE_DEVICES",
              "NCCL_MULTI_RANK_GPU_ENABLE"):
        if k in os.environ:
            rep.write(f"environment: {k}={os.environ[k]}")
    rep.write("")
    nccl = int(facts.get("nccl") or 0)
    if not DOUBLE and not facts.get("gpus"):
        rep.write(f"SKIP  every step: no usable GPU here ({facts.get('gpu_error') or smi_out or 'nvidia-smi lists none'}); "
                  "tests/gpu/one_gpu_check.sh --double dry-runs the steps on tests/cupy_double")
        return 0
    if not facts.get("cupy") or not facts.get("nccl_available"):
        rep.write("FAIL  CuPy with NCCL is not importable: nothing else can run "
                  "(pip install cupy-cuda13x nvidia-nccl-cu13, or '.[gpu-cuda13]')")
        return 1

    # --- one rank --------------------------------------------------------------------
    rep.step("1 rank: every collective x dtype (bfloat16 too)", one_rank(tmp, "ops"))
    rep.step("1 rank: collectives from another thread / inside a non-blocking stream",
             one_rank(tmp, "thread_stream"))
    rep.step("1 rank: 0 host waits of any kind per allreduce",
             one_rank(tmp, "host_waits"))

    # --- two ranks on one GPU --------------------------------------------------------
    def refused():
        start = time.monotonic()
        res = shared_ranks(tmp, ["tests/gpu_worker.py", "handshake"], timeout=120)
        took = time.monotonic() - start
        messages = {(r or {}).get("init_error") for r in results_of(res)}
        if res.returncodes != [3, 3] or len(messages) != 1 or None in messages:
            return "FAIL", f"exit codes {res.returncodes}\n{tail(''.join(res.outputs))}"
        message = messages.pop()
        ok = "Duplicate GPU detected" in message and "NCCL_MULTI_RANK_GPU_ENABLE" in message
        return ("PASS" if ok and took < 60 else "FAIL"), f"{took:.1f} s: {message}"
    rep.step("2 ranks on one GPU without the opt-in: refused at init, one message", refused)

    shared_ok = nccl >= 23000
    why = f"NCCL {nccl} < 2.30 cannot put two ranks on one GPU"

    def shared(scenario_argv, check, extra=None, timeout=240, until=None):
        def step():
            if not shared_ok:
                return "SKIP", why
            res = shared_ranks(tmp, scenario_argv, extra={**OPT_IN, **(extra or {})},
                               timeout=timeout, until=until)
            return check(res)
        return step

    def all_ok(res):
        outs = results_of(res)
        bad = [o for o in outs if not o or o.get("errors")]
        if not res.ok() or bad:
            return "FAIL", f"exit {res.returncodes}: {bad}\n{tail(''.join(res.outputs))}"
        return "PASS", json.dumps(outs)[:300]

    rep.step("2 ranks, 1 GPU, opt-in: every collective x dtype (bfloat16 too)",
             shared(["tests/gpu_worker.py", "ops"], all_ok))
    for strategy in ("AllReduce", "Reduce"):
        def same_weights(res):
            outs = results_of(res)
            if not res.ok() or not all(outs) or outs[0]["w"] != outs[1]["w"]:
                return "FAIL", f"exit {res.returncodes}\n{tail(''.join(res.outputs))}"
            return "PASS", f"types {outs[0]['types']}, ranks agree on w"
        rep.step(f"2 ranks, 1 GPU, opt-in: DistributedOptimizer {strategy}",
                 shared(["tests/gpu_worker.py", "optimizer", strategy], same_weights))

    def never_launches(res):
        out = results_of(res)[0] or {}
        seconds = out.get("seconds", 1e9)
        ok = out.get("error") and seconds < TIMEOUT + 2
        return ("PASS" if ok else "FAIL"), f"{seconds:.1f} s (limit {TIMEOUT + 2}): " \
            f"{out.get('error')}"
    rep.step(f"2 ranks, 1 GPU, opt-in: a rank that never launches (abort within "
             f"{TIMEOUT} s + 2 s)", shared(["tests/gpu_worker.py", "stuck"], never_launches,
                                           until=[0], timeout=120))

    def killed(res):
        outs = results_of(res)
        out = outs[0] or {}
        seconds = out.get("seconds", 1e9)
        ok = "died" in str(out.get("error")) and seconds < 2 and res.returncodes[1] == -9
        return ("PASS" if ok else "FAIL"), f"{seconds:.2f} s (limit 2): {out.get('error')}"
    rep.step("2 ranks, 1 GPU, opt-in: a rank killed inside its NCCL call (seen within 2 s)",
             shared(["tests/gpu_worker.py", "die_in_kernel"], killed, until=[0], timeout=120))

    # --- queued work, the watchdog, the hash phase (tests/e2e/test_gpu_queue.py's cases) --
    def sticky(res):
        sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
        from test_gpu_queue import sticky_errors_agree
        outs = results_of(res)
        try:
            message = sticky_errors_agree(outs)
        except (AssertionError, KeyError, StopIteration, TypeError) as exc:
            return "FAIL", f"{exc!r}\n{tail(''.join(res.outputs))}"
        ok = "cudaErrorIllegalAddress" in message or "illegal" in message
        return ("PASS" if ok else "FAIL"), message[:300]
    rep.step("2 ranks, 1 GPU, opt-in: a faulting kernel before a queued allreduce: every "
             "rank's next call raises the same error", shared(["tests/gpu_worker.py", "sticky"],
                                                              sticky, timeout=120))

    def hang(res):
        lines = [first_result(text) for text in res.outputs]
        errors = {(l or {}).get("error") for l in lines}
        message = next(iter(errors)) or ""
        ok = len(errors) == 1 and re.search(r"collective #2\) did not finish within", message)
        return ("PASS" if ok else "FAIL"), f"{message[:300]}\n{tail(''.join(res.outputs))}"
    rep.step("2 ranks, 1 GPU, opt-in: a stalled stream with work in flight: the deadline names "
             "collective #2", shared(["tests/gpu_worker.py", "hang_in_flight"], hang,
                                     timeout=120))

    def diverged(res):
        lines = [first_result(text) for text in res.outputs]
        errors = {(l or {}).get("error") for l in lines}
        message = next(iter(errors)) or ""
        ok = len(errors) == 1 and "diverged at collective #10: allreduce: shape mismatch" \
            in message
        return ("PASS" if ok else "FAIL"), f"{message[:300]}\n{tail(''.join(res.outputs))}"
    rep.step("2 ranks, 1 GPU, opt-in: a shape mismatch after the hash phase is named",
             shared(["tests/gpu_worker.py", "mismatch", "hashed", "A", "B"], diverged,
                    timeout=120))

    def backpressure(res):
        outs = results_of(res)
        out = outs[0] or {}
        ok = res.ok() and out.get("ok") and max(out.get("inflight") or [9]) <= 1 \
            and out.get("after_sync") == 0
        return ("PASS" if ok else "FAIL"), json.dumps(out)[:300]
    rep.step("2 ranks, 1 GPU, opt-in: a full in-flight queue waits for its oldest work",
             shared(["tests/gpu_worker.py", "backpressure"], backpressure,
                    extra={"FLUIDCTL_GPU_INFLIGHT": "2"}))

    def learns(res):
        text = "".join(res.outputs)
        losses = [float(x) for x in re.findall(r"epoch \d+: loss ([\d.]+)", text)]
        ok = res.ok() and len(losses) >= 2 and losses[-1] < losses[0]
        return ("PASS" if ok else "FAIL"), f"losses {losses}" + ("" if ok else "\n" + tail(text))
    rep.step("2 ranks, 1 GPU, opt-in: templates/train_nccl2.py learns",
             shared(["templates/train_nccl2.py", "--epochs", "3", "--samples", "2048"], learns))

    def train_one():
        res, _ = train(tmp, "train1", ["--gpus", "1", "templates/train_nccl2.py", "--epochs",
                                       "3", "--samples", "2048"])
        ok = res.returncode == 0 and "device gpu:0" in res.stdout
        return ("PASS" if ok else "FAIL"), (res.stdout.strip().splitlines() or [""])[-1] + \
            ("" if ok else "\n" + tail(res.stdout + res.stderr))
    rep.step("1 rank: templates/train_nccl2.py under fluidctl train --gpus 1", train_one)

    # --- the bench -------------------------------------------------------------------
    def bench():
        peer = "torch" if facts.get("torch_gpu") and not DOUBLE else "none"
        sizes = "1MiB,64MiB,256MiB" if not DOUBLE else "64KiB"
        res = run([sys.executable, "bench/gpu_allreduce.py", "--gpus", "1", "--peer", peer,
                   "--sizes", sizes, "--reps", "5"], timeout=420)
        if res.returncode != 0:
            return "FAIL", f"exit {res.returncode}\n{tail(res.stdout + res.stderr)}"
        note = "" if peer == "torch" else " (torch NCCL half skipped: no CUDA torch here)"
        return "PASS", f"1 GPU, fluidctl vs {peer}{note}\n{res.stdout}"
    rep.step("bench/gpu_allreduce.py: fluidctl NCCL vs torch NCCL", bench)

    # --- the real-GPU suite ------------------------------------------------------------
    def suite():
        env = {}
        if DOUBLE:       # tests/gpu skips itself where nvidia-smi lists no real GPU
            env["PATH"] = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                          if not p.startswith(tmp_smi_root))
        res = run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs",
                   "-p", "no:cacheprovider"], extra=env, timeout=540)
        last = (res.stdout.strip().splitlines() or ["?"])[-1]
        if res.returncode not in (0, 5):
            return "FAIL", f"{last}\n{tail(res.stdout)}"
        skips = "\n".join(l for l in res.stdout.splitlines() if l.startswith("SKIPPED"))
        return ("SKIP" if " passed" not in last else "PASS"), last + ("\n" + skips if skips else "")
    tmp_smi_root = os.environ.get("FLUIDCTL_GPU_CHECK_FAKE_SMI", "//none")
    rep.step("pytest -m gpu (tests/gpu)", suite)

    rep.write("")
    c = rep.counts
    rep.write(f"summary: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped "
              f"({'dry run on the double' if DOUBLE else 'real GPU'}); report: {path}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
