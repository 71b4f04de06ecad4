"""``fluidctl shard-data --to-hosts``: each shard goes only to the node that runs its trainer.

Trainers are laid out over the hostfile's nodes as ``fluidctl train --hostfile`` lays them out
(node 0 takes ranks 0..slots-1, and so on), so shard i lands where trainer i reads it. Every
node also gets the manifest (the runtime checks the shard count against it). Files are sent
over SFTP to a temporary name and renamed into place, then checked against the manifest's
digest on the node (``sha256sum`` for sha256; for xxh3-128 and blake3 the node's Python, the
one at this interpreter's path, with fluidctl installed as it must be to train there). All nodes are connected to before anything is sharded, so an unreachable
node costs nothing.
"""
from __future__ import annotations

import os
import posixpath
import stat
import sys
from pathlib import Path

from fluidctl.errors import UsageError, node_failures
from fluidctl.planning.hosts import Host

TYPE_CHECKING = False
if TYPE_CHECKING:       # annotations only: typing (and re) stay off a small run's start-up
    from typing import Dict, List, Optional, Sequence

MANIFEST = "manifest.json"
# prints "<hex digest>  <path>" per path, as sha256sum does
_DIGEST_SNIPPET = ("import sys\nfrom fluidctl.digest import file_digest\n"
                   "for p in sys.argv[2:]:\n    print(file_digest(p, sys.argv[1]) + '  ' + p)")


def remote_digests(node, algorithm: str, paths: Sequence[str]) -> Dict[str, str]:
    """{path: hex digest} of files on a node (absent for a file that could not be read)."""
    if not paths:
        return {}
    if algorithm == "sha256":
        return node.remote_sha256(list(paths))
    result = node.run([sys.executable, "-c", _DIGEST_SNIPPET, algorithm, *paths])
    digests = {}
    for line in result.stdout.splitlines():
        value, _, name = line.partition("  ")
        digests[name] = value
    return digests


def ranks_by_node(hosts: Sequence[Host], trainers: int) -> Dict[str, List[int]]:
    """{node name: [trainer ranks]} as the launcher places them; slots must add up."""
    total = sum(h.slots for h in hosts)
    if total != trainers:
        raise UsageError(f"the hosts hold {total} trainer slot(s) but --trainers is {trainers}",
                         "make the hostfile's slots= add up to --trainers (one shard per "
                         "trainer)")
    from fluidctl.planning.plan import place_ranks
    return dict(zip([h.name for h in hosts], place_ranks([h.slots for h in hosts])))


def remote_out_dir(out_dir: str, remote_dir: Optional[str], host: str) -> str:
    """Where OUT_DIR is on a node: absolute stays, relative is under --remote-dir (default:
    this directory's path); '{host}' in --remote-dir is the node's name."""
    if os.path.isabs(out_dir):
        return out_dir
    base = (remote_dir or os.getcwd()).replace("{host}", host)
    return posixpath.normpath(posixpath.join(base, out_dir))


def connect(hosts: Sequence[Host], *, ssh_config, accept_new: bool, timeout: float):
    """Every node connected to, its progress said as it comes (a silent node named while it is
    waited for), or one error naming each node that could not be reached."""
    from fluidctl.remote.progress import NodeProgress
    from fluidctl.remote.ssh import connect_all
    from fluidctl.remote.sshconfig import resolve_hosts
    resolved, targets = resolve_hosts(hosts, ssh_config, accept_new)
    with NodeProgress([h.name for h in hosts], timeout=timeout) as say:
        connected = connect_all(resolved, targets, timeout=timeout, timeout_option="",
                                progress=say)
    if connected.failures:
        connected.close()
        raise node_failures("could not be reached", connected.failures.items(), len(hosts),
                            "fix the node(s) or the hostfile; nothing was written",
                            error=UsageError)
    return resolved, connected


def send_shards(manifest: dict, out_dir: str, hosts: Sequence[Host], nodes, placed,
                remote_dir: Optional[str]) -> Dict[str, List[str]]:
    """Send every node its shards and the manifest; verify; return {node: [remote paths]}.
    Each node's steps are said as they happen (a bar per node on a terminal); every node that
    failed is named, one line each."""
    from fluidctl.remote.progress import NodeProgress
    from fluidctl.remote.ssh import NODE_LOST, parallel
    from fluidctl.remote.sftp import FileToSend, SyncPlan, send_files
    from fluidctl.runtime.data import shard_digest
    from fluidctl.units import human_bytes

    shards = manifest["shards"]
    plans = {}
    for host in hosts:
        where = remote_out_dir(out_dir, remote_dir, host.name)
        names = [shards[r]["file"] for r in placed[host.name]] + [MANIFEST]
        files = []
        for name in names:
            local = Path(out_dir) / name
            st = local.stat()
            files.append(FileToSend(local, posixpath.join(where, name), st.st_size,
                                    st.st_mtime, stat.S_IMODE(st.st_mode)))
        plans[host.name] = SyncPlan(where, files)
    progress = NodeProgress([h.name for h in hosts],
                            totals={name: sum(f.size for f in plan.send)
                                    for name, plan in plans.items()})

    def one(host: Host):
        node, plan = nodes[host.name], plans[host.name]
        progress.say(host.name, f"sending {len(plan.send) - 1} shard(s) and the manifest "
                                f"({human_bytes(sum(f.size for f in plan.send))})")
        try:
            send_files(node, plan, progress.advancer(host.name))
        except NODE_LOST as exc:
            return f"copy failed: {exc}"
        progress.say(host.name, "verifying the shards' digests")
        expected = {posixpath.join(plan.remote_dir, shards[r]["file"]): shard_digest(shards[r])
                    for r in placed[host.name]}
        bad = []
        for algorithm in {alg for alg, _ in expected.values() if alg}:
            wanted = [p for p, (alg, _) in expected.items() if alg == algorithm]
            got = remote_digests(node, algorithm, wanted)
            bad += [p for p in wanted if got.get(p) != expected[p][1]]
        if bad:
            return f"{', '.join(bad)} differ from the manifest after the copy"
        progress.say(host.name, f"done ({progress.elapsed()})")
        return [f.remote for f in plan.send]

    with progress:
        results = dict(zip([h.name for h in hosts], parallel(list(hosts), one)))
    failures = [(name, why) for name, why in results.items() if isinstance(why, str)]
    if failures:
        raise node_failures("failed to receive the shards", failures, len(hosts),
                            "run the command again", exit_code=1)
    return results
