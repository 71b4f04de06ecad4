"""Rendezvous at scale: node agents (coroutines over real loopback TCP) fetch their layout from
one root, at 1K / 4K / 12K nodes x 8 ranks, for three contenders in the same run.

    python bench/rendezvous_scale.py [--nodes 1000,4000,12000] [--gpus 8] [--repeat 3]
                                     [--contenders fluidctl,ranks,torch,today] [--cap 120]

* fluidctl: the store of ``fluidctl.runtime`` (``storeserver``), real frames and HMAC
  handshake with a job token; each agent sends one ``join`` with its node's 8 rank records and
  gets back its node's view (its ranks, node count, ring neighbours), laid out once at the root.
* torch: ``torch.distributed.TCPStore`` (libuv) driven the way torch elastic does it: each agent
  1 set (its records) + 1 get (its layout); the root ``wait``s and ``multi_get``s every node's
  record, lays out once (the same O(N) pass) and ``multi_set``s one layout per node.
* ranks: the same store with no node agent: every rank connects and joins with its own record
  (what ranks under mpirun or srun do); run up to ``--ranks-max-ranks``.
* today: the store of fluidctl a2a3fc9 (thread per connection, loaded from ``git show``): each
  agent sets its 8 records and reads all N records with one ``multi_get`` (the per-rank code
  does it once per rank); run only up to ``--today-max-ranks``, and stopped at ``--cap``.

Each root runs in a process of its own (its CPU seconds and peak RSS are its own). Agents run
in ``--agent-procs`` processes (as nodes would, in parallel; uvloop's event loop where
installed), at most ``--window`` connecting at once for every contender. Agents past the first
64 bind source addresses spread across 127.0.0.0/8 (64 per address), so no address runs out
of ephemeral ports. Printed per run: seconds until every agent holds its layout, root CPU-s and
peak RSS, messages and bytes each way (agents' count; the root's read/written bytes for torch),
the largest request, connection retries, and how many nodes' layouts match make_plan's.
"""
import argparse
import asyncio
import concurrent.futures
import datetime
import importlib.util
import json
import math
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import msgpack  # noqa: E402

from fluidctl.runtime import rendezvous, wire  # noqa: E402
from fluidctl.runtime.storeserver import raise_nofile  # noqa: E402

TOKEN = "rendezvous-bench-token"
TODAY = "a2a3fc9"
PER_ADDRESS = 64


# --- the world, from the planner -------------------------------------------------------------
def plan_nodes(n_nodes: int, gpus: int):
    """[[{rank, ep, node, pid}] per node] in node order, from make_plan (the truth to check)."""
    import plan_scale
    from fluidctl.planning import plan as planner
    spec, ports = plan_scale.build(n_nodes, gpus)
    plan = planner.make_plan(spec, ports, backend="ssh")
    nodes, index = [], {}
    for proc in sorted(plan.procs, key=lambda p: p.rank):
        i = index.setdefault(proc.host, len(nodes))
        if i == len(nodes):
            nodes.append([])
        nodes[i].append({"rank": proc.rank, "ep": proc.endpoint, "node": proc.host,
                         "pid": 10000 + proc.rank})
    return nodes


def matches(view: dict, nodes, i: int, world: int) -> bool:
    """``view`` is node i's share of make_plan's world (of ``world`` ranks)."""
    k = len(nodes)
    mine = nodes[i]
    return (view["world"] == world and view["nodes"] == k
            and view["node_index"] == i
            and [tuple(x) for x in view["local"]] == [(r["rank"], r["ep"], r["pid"]) for r in mine]
            and tuple(view["prev"]) == (nodes[i - 1][0]["rank"], nodes[i - 1][0]["ep"])
            and tuple(view["next"]) == (nodes[(i + 1) % k][0]["rank"],
                                        nodes[(i + 1) % k][0]["ep"]))


def _source(i: int) -> dict:
    """Agents past the first ``PER_ADDRESS`` bind an address of their own block."""
    return {"local_addr": (source_address(i), 0)} if i >= PER_ADDRESS else {}


def source_address(i: int) -> str:
    a = i // PER_ADDRESS
    return f"127.{10 + a // 62500}.{(a // 250) % 250}.{a % 250 + 1}"


# --- a sandbox without a reachable DNS server --------------------------------------------------
NUMERIC_NAMES_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>
int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen,
                char *serv, socklen_t servlen, int flags) {
    static int (*real)(const struct sockaddr *, socklen_t, char *, socklen_t, char *,
                       socklen_t, int);
    if (!real) real = dlsym(RTLD_NEXT, "getnameinfo");
    return real(sa, salen, host, hostlen, serv, servlen,
                (flags | NI_NUMERICHOST | NI_NUMERICSERV) & ~NI_NAMEREQD);
}
"""


def numeric_names() -> str:
    """TCPStore names each client socket's address with a reverse lookup (getnameinfo); where
    no DNS server answers, every few connections stall for the resolver's timeout (5 s), which
    is not what this bench measures. An LD_PRELOAD shim, built here with cc, answers such
    lookups numerically in every process of the bench ('' when no cc)."""
    out = Path(tempfile.mkdtemp()) / "libnumericnames.so"
    src = out.with_suffix(".c")
    src.write_text(NUMERIC_NAMES_C)
    try:
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(src), "-ldl"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return str(out)


# --- roots (one process each) ----------------------------------------------------------------
def _peak_rss_mib() -> float:
    """This process's own peak RSS (ru_maxrss would count the forking parent's pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _io():
    try:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(fields["rchar"]), int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return 0, 0


def root_main(kind: str, world: int, k: int, cap: float) -> None:
    raise_nofile()
    if kind in ("fluidctl", "ranks"):
        from fluidctl.runtime.storeserver import StoreServer
        server = StoreServer("127.0.0.1", 0, TOKEN, members=k if kind == "fluidctl" else world)
        port = server.port
    elif kind == "today":
        source = subprocess.run(["git", "-C", str(HERE.parent), "show",
                                 f"{TODAY}:fluidctl/runtime/store.py"], check=True,
                                capture_output=True, text=True).stdout
        path = Path(tempfile.mkdtemp()) / "store_today.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("store_today", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        server = module.StoreServer("127.0.0.1", 0, TOKEN)
        port = server.port
    else:
        from torch.distributed import TCPStore
        server = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=cap),
                          wait_for_workers=False, use_libuv=True)
        port = server.port
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    io0 = _io()
    print(f"port {port}", flush=True)
    sys.stdin.readline()                        # "go": the agents start now
    if kind == "torch":                         # the root's part of torch elastic's scheme
        keys = [f"node/{i}" for i in range(k)]
        max_request = sum(len(key) + 8 for key in keys)      # its multi_get: every key
        server.wait(keys)
        records = {}
        for value in server.multi_get(keys):
            for rec in msgpack.unpackb(value):
                rank, rec = rendezvous.check_record(rec)
                records[rank] = rec
        layout = rendezvous.Layout(world, records)
        server.multi_set([f"layout/{i}" for i in range(k)],
                         [msgpack.packb(layout.view(layout.node_ranks[i][0])) for i in range(k)])
    sys.stdin.readline()                        # "report"
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    io1 = _io()
    print(json.dumps({"max_request": max_request if kind == "torch" else 0,
                      "cpu": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
                      "rss_mib": _peak_rss_mib(), "read": io1[0] - io0[0],
                      "written": io1[1] - io0[1]}), flush=True)


class Root:
    def __init__(self, kind, world, k, cap):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--root", kind, "--world", str(world), "--k", str(k),
             "--cap", str(cap)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.proc.kill()
            raise RuntimeError(f"the {kind} root did not start")
        self.port = int(line.split()[1])

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def report(self) -> dict:
        try:
            self.proc.stdin.write("report\n")
            self.proc.stdin.flush()
            out = self.proc.stdout.readline()
            return json.loads(out) if out else {}
        finally:
            self.proc.kill()
            self.proc.wait(10)


# --- agents speaking fluidctl's wire protocol (asyncio) ---------------------------------------
class Stats:
    def __init__(self):
        self.up = self.down = self.bytes_up = self.bytes_down = 0
        self.max_request = self.retries = self.correct = 0


async def _read_frame(reader, stats):
    prefix = await reader.readexactly(wire.PREFIX.size)
    head_len, size = wire.parse_prefix(prefix, wire.MAX_HEADER, 1 << 40)
    head = await reader.readexactly(head_len)
    payload = await reader.readexactly(size) if size else b""
    stats.down += 1
    stats.bytes_down += wire.PREFIX.size + head_len + size
    return wire.parse_header(head), payload


def _send(writer, stats, header, payload=b""):
    frame = wire.pack_frame(header, payload)
    writer.write(frame)
    stats.up += 1
    stats.bytes_up += len(frame)
    stats.max_request = max(stats.max_request, len(frame))


async def _connect(port, i, stats, window, deadline):
    """An authenticated connection (HMAC challenge both ways), retried on a refusal."""
    delay = 0.01
    while True:
        try:
            async with window:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, **_source(i))
                hello, _ = await _read_frame(reader, stats)
                nonce = os.urandom(32)
                _send(writer, stats, {"op": "auth", "nonce": nonce,
                                      "mac": wire._mac(TOKEN, b"c", hello["nonce"], nonce)})
                ok, _ = await _read_frame(reader, stats)
                if ok.get("mac") != wire._mac(TOKEN, b"s", nonce, hello["nonce"]):
                    raise RuntimeError("the root failed authentication")
                return reader, writer
        except (OSError, asyncio.IncompleteReadError, wire.WireError):
            stats.retries += 1
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.5)


async def fluidctl_agent(port, nodes, i, stats, window, cap, deadline):
    reader, writer = await _connect(port, i, stats, window, deadline)
    _send(writer, stats, {"op": "join", "key": "layout", "n": stats.world, "records": nodes[i],
                          "timeout": cap})
    reply, _ = await _read_frame(reader, stats)
    writer.close()
    stats.correct += bool(reply.get("ok")) and matches(reply["views"][0], nodes, i, stats.world)


async def ranks_agent(port, nodes, i, stats, window, cap, deadline):
    """No agent: every rank of node ``i`` connects and joins by itself (what ranks under
    mpirun or srun do, with no node agent to join for them)."""
    per = len(nodes[i])

    async def one(j, rec):
        reader, writer = await _connect(port, i * per + j, stats, window, deadline)
        _send(writer, stats, {"op": "join", "key": "layout", "n": stats.world,
                              "records": [rec], "timeout": cap})
        reply, _ = await _read_frame(reader, stats)
        writer.close()
        return bool(reply.get("ok")) and matches(reply["views"][0], nodes, i, stats.world)
    seen = await asyncio.gather(*(one(j, rec) for j, rec in enumerate(nodes[i])))
    stats.correct += all(seen)


async def today_agent(port, nodes, i, stats, window, cap, deadline):
    reader, writer = await _connect(port, i, stats, window, deadline)
    for rec in nodes[i]:
        _send(writer, stats, {"op": "set", "key": f"rank/{rec['rank']}"},
              msgpack.packb({"ep": rec["ep"], "node": rec["node"], "pid": rec["pid"]}))
        await _read_frame(reader, stats)
    _send(writer, stats, {"op": "wait", "keys": [f"rank/{r}" for r in range(stats.world)],
                          "timeout": cap, "fetch": True})
    reply, payload = await _read_frame(reader, stats)
    writer.close()
    if reply.get("ok"):                 # every record, as today's bootstrap reads them
        pos, records = 0, {}
        for r, size in enumerate(reply["sizes"]):
            records[r] = msgpack.unpackb(payload[pos:pos + size])
            pos += size
        layout = rendezvous.Layout(stats.world, records)
        stats.correct += matches(layout.view(nodes[i][0]["rank"]), nodes, i, stats.world)


async def run_agents(kind, port, nodes, mine, stats, window, cap, start):
    agent = {"fluidctl": fluidctl_agent, "ranks": ranks_agent}.get(kind, today_agent)
    sem = asyncio.Semaphore(window)
    deadline = start + cap
    tasks = [asyncio.ensure_future(agent(port, nodes, i, stats, sem, cap, deadline))
             for i in mine]
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for t in pending:
        t.cancel()
    failed = sum(1 for t in done if t.exception() is not None)
    return not pending and not failed


def _event_loop_run(coro):
    """The agents' event loop: uvloop's where installed (the agents stand for other machines:
    their cost here should not hide the root's), asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def agent_process(kind, port, nodes, mine, world, window, cap, ready, go, out):
    """One of several processes running agents (as nodes would, in parallel): starts with the
    others on ``go``; reports (ok, when it finished, its counts)."""
    raise_nofile()
    if kind == "torch":
        import torch.distributed  # noqa: F401  (imported before the clock starts)
    stats = Stats()
    stats.world = world
    ready.put(1)
    go.wait()
    if kind == "torch":
        ok = run_torch(port, nodes, mine, stats, window, cap)
    else:
        ok = _event_loop_run(run_agents(kind, port, nodes, mine, stats, window, cap,
                                        time.monotonic()))
    out.put((ok, time.monotonic(), vars(stats)))


def run_agent_processes(kind, root, nodes, stats, args):
    """(ok, start): agents spread over ``--agent-procs`` processes, started at once."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    k, p = len(nodes), args.agent_procs
    procs = [ctx.Process(target=agent_process,
                         args=(kind, root.port, nodes, range(j, k, p), stats.world,
                               max(1, args.window // p),
                               args.cap, ready, go, out))
             for j in range(p)]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        root.go()
        start = time.monotonic()
        go.set()
        ok, end = True, start
        for _ in procs:
            done, when, counts = out.get(timeout=args.cap + 60)
            ok, end = ok and done, max(end, when)
            for name, value in counts.items():
                if name == "max_request":
                    stats.max_request = max(stats.max_request, value)
                elif name != "world":
                    setattr(stats, name, getattr(stats, name) + value)
        return ok, end - start
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


# --- torch elastic's scheme on TCPStore --------------------------------------------------------
def run_torch(port, nodes, mine, stats, threads, cap):
    """This process's agents: each 1 set (its records) and 1 get (its layout)."""
    from torch.distributed import TCPStore
    timeout = datetime.timedelta(seconds=cap)
    stores = {}

    def up(i):
        store = TCPStore("127.0.0.1", port, None, False, timeout, wait_for_workers=False,
                         use_libuv=True)
        value = msgpack.packb(nodes[i])
        store.set(f"node/{i}", value)
        stores[i] = store
        return len(value)

    def down(i):
        view = msgpack.unpackb(stores[i].get(f"layout/{i}"))
        return matches(view, nodes, i, stats.world)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(up, mine))
        stats.correct = sum(pool.map(down, mine))
    stats.up = stats.down = len(sizes)
    stats.max_request = max(sizes)
    stores.clear()
    return True


# --- one run, many runs ------------------------------------------------------------------------
def one_run(kind, nodes, args):
    world = sum(len(n) for n in nodes)
    root = Root(kind, world, len(nodes), args.cap)
    stats = Stats()
    stats.world = world
    try:
        ok, elapsed = run_agent_processes(kind, root, nodes, stats, args)
    finally:
        rep = root.report()
    if kind == "torch":                          # the root's own count of bytes each way
        stats.bytes_up, stats.bytes_down = rep.get("read", 0), rep.get("written", 0)
        stats.up, stats.down = stats.up + 1, stats.down + 1      # its multi_get, multi_set
        stats.max_request = max(stats.max_request, rep.get("max_request", 0))
    return {"ok": ok and stats.correct == len(nodes), "s": elapsed, "cpu": rep.get("cpu", 0.0),
            "rss": rep.get("rss_mib", 0.0), "up": stats.up, "down": stats.down,
            "bytes_up": stats.bytes_up, "bytes_down": stats.bytes_down,
            "max_request": stats.max_request, "retries": stats.retries,
            "correct": stats.correct}


def exponent(points):
    """Least-squares slope of log(seconds) over log(ranks)."""
    if len(points) < 2:
        return float("nan")
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1000,4000,12000", help="node counts, comma-separated")
    ap.add_argument("--gpus", type=int, default=8, help="ranks per node")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--contenders", default="fluidctl,ranks,torch,today")
    ap.add_argument("--cap", type=float, default=120.0, help="seconds before a run is stopped")
    ap.add_argument("--today-max-ranks", type=int, default=8000)
    ap.add_argument("--ranks-max-ranks", type=int, default=32000,
                    help="the largest world the 'ranks' contender runs")
    ap.add_argument("--window", type=int, default=256,
                    help="agents connecting at once, in all (TCPStore: client threads)")
    ap.add_argument("--no-numeric-names", dest="numeric_names", action="store_false",
                    help="leave TCPStore's reverse lookups to the resolver")
    ap.add_argument("--agent-procs", type=int, default=8,
                    help="processes every contender's agents are spread over")
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.root:
        return root_main(args.root, args.world, args.k, args.cap)
    raise_nofile()
    kinds = args.contenders.split(",")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if "torch" in kinds and args.numeric_names:    # for every process started from here on
        shim = numeric_names()
        if shim:
            os.environ["LD_PRELOAD"] = " ".join(filter(None, (os.environ.get("LD_PRELOAD"),
                                                              shim)))
        print(f"reverse lookups answered numerically: {'yes' if shim else 'no (no cc)'}")
    sizes = [int(x) for x in args.nodes.split(",")]
    print(f"{'contender':>9} {'ranks':>6} {'nodes':>6} {'s':>7} {'root CPU-s':>10} "
          f"{'root RSS':>9} {'msgs up/down':>15} {'bytes up / down':>21} {'max req':>9} "
          f"{'retries':>7} {'correct':>12}", flush=True)
    points = {k: [] for k in kinds}
    best = {}
    for n in sizes:
        nodes = plan_nodes(n, args.gpus)
        world = n * args.gpus
        for kind in kinds:
            if kind == "today" and world > args.today_max_ranks:
                print(f"{kind:>9} {world:>6} {n:>6}   (skipped: over --today-max-ranks)")
                continue
            if kind == "ranks" and world > args.ranks_max_ranks:
                print(f"{kind:>9} {world:>6} {n:>6}   (skipped: over --ranks-max-ranks)")
                continue
            runs = []
            for _ in range(args.repeat):
                runs.append(one_run(kind, nodes, args))
                if not runs[-1]["ok"]:
                    break                       # past the cap once: no use trying again
            med = {key: statistics.median(r[key] for r in runs)
                   for key in ("s", "cpu", "rss", "max_request", "retries")}
            r = runs[0]
            ok = all(x["ok"] for x in runs)
            when = f"{med['s']:7.2f}" if ok else f">{args.cap:6.0f}"
            print(f"{kind:>9} {world:>6} {n:>6} {when} {med['cpu']:10.2f} "
                  f"{med['rss']:6.0f} MiB {r['up']:>7}/{r['down']:<7} "
                  f"{_fmt_bytes(r['bytes_up']):>10}/{_fmt_bytes(r['bytes_down']):<10} "
                  f"{_fmt_bytes(med['max_request']):>9} {med['retries']:7.0f} "
                  f"{r['correct']:>5}/{n:<6}", flush=True)
            if ok:
                points[kind].append((world, med["s"]))
                best[(kind, world)] = med
    print()
    for kind in kinds:
        print(f"{kind:>9}: growth exponent {exponent(points[kind]):.2f} over "
              f"{', '.join(str(w) for w, _ in points[kind]) or 'no finished size'} ranks")
    top = max(sizes) * args.gpus
    mine, theirs = best.get(("fluidctl", top)), best.get(("torch", top))
    if mine:
        goals = [("under 10 s", mine["s"] < 10), ("root CPU under 5 s", mine["cpu"] < 5),
                 ("no request over 64 KiB", mine["max_request"] <= 64 << 10),
                 ("0 retries", mine["retries"] == 0)]
        if len(points["fluidctl"]) > 1:
            goals.append(("exponent <= 1.1", exponent(points["fluidctl"]) <= 1.1))
        if theirs:
            goals.append(("faster than TCPStore", mine["s"] < theirs["s"]))
        print(f"goals at {top} ranks: " + ", ".join(f"{g}: {'yes' if ok else 'NO'}"
                                                    for g, ok in goals))


if __name__ == "__main__":
    main()
