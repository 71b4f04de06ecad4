"""The node agent's interface list (fluidctl/node/ifaddrs.py) against psutil's, the library it
stands in for on the probe's path."""
import json
import shutil
import subprocess
import sys

import pytest

from fluidctl.node import ifaddrs
from importguard import run_blocked

COMPARE = ("import json; from fluidctl.node import ifaddrs; "
           "print(json.dumps([ifaddrs.ipv4_interfaces(), ifaddrs._from_psutil()]))")


def test_the_same_interfaces_as_psutil_here():
    ours = ifaddrs.ipv4_interfaces()
    assert ours == ifaddrs._from_psutil()
    assert ("127.0.0.1", "255.0.0.0") in ours["lo"]


def _in_fresh_netns(setup: str):
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    done = subprocess.run(["unshare", "--net", "sh", "-ec",
                           f'{setup}\nexec "$0" -c "$1"', sys.executable, COMPARE],
                          capture_output=True, text=True, timeout=60)
    if done.returncode and "unshare" in done.stderr:
        pytest.skip(f"no network namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_interfaces_not_running_are_left_out_and_every_address_of_one_is_listed():
    """A fresh network namespace: lo is down; fl2 is up but its peer is down (no carrier: not
    running, which is psutil's isup); fl0 has two addresses and lists both, netmasks
    included."""
    ours, theirs = _in_fresh_netns(
        "ip link add fl0 type veth peer name fl1\n"
        "ip addr add 198.18.0.1/24 dev fl0\n"
        "ip addr add 198.19.0.1/16 dev fl0\n"
        "ip addr add 198.18.0.2/24 dev fl1\n"
        "ip link set fl0 up\n"
        "ip link set fl1 up\n"
        "ip link add fl2 type veth peer name fl3\n"
        "ip addr add 198.18.1.1/24 dev fl2\n"
        "ip link set fl2 up")
    assert ours == theirs
    assert ours == {"fl0": [["198.18.0.1", "255.255.255.0"], ["198.19.0.1", "255.255.0.0"]],
                    "fl1": [["198.18.0.2", "255.255.255.0"]]}


def test_the_probe_does_not_import_psutil():
    """The probe is on the path to every job's first rank: psutil's import (5 ms) is not."""
    done = run_blocked(["fluidctl.node.agent"], ["psutil"],
                       calls="import fluidctl.node.agent as a; a.probe(2)")
    assert done.stdout.strip() == "ok", done.stderr
