"""Hostfile formats, their errors (with line numbers), and ssh config resolution."""
import getpass
import os
import re

import paramiko
import pytest
from hypothesis import example, given, settings, strategies as st

from fluidctl.errors import UsageError
from fluidctl.planning import hosts
from fluidctl.planning.hosts import (Host, format_hostfile, load_hosts, parse_hostfile,
                                   parse_hostfile_text, parse_hosts_arg)
from fluidctl.remote.sshconfig import load_config, resolve, resolve_hosts


def test_every_hostfile_format():
    text = """
# a comment line
node1 slots=4            # OpenMPI / DeepSpeed
node2:2                  # horovod
node3

alice@node4 slots=2 max_slots=8
bob@node5:2222 slots=3
[fe80::1]:4
10.0.0.7:5
"""
    hosts = parse_hostfile_text(text)
    assert [(h.name, h.user, h.port, h.slots, h.slots_given) for h in hosts] == [
        ("node1", None, None, 4, True),
        ("node2", None, None, 2, True),
        ("node3", None, None, 1, False),
        ("node4", "alice", None, 2, True),
        ("node5", "bob", 2222, 3, True),
        ("fe80::1", None, None, 4, True),
        ("10.0.0.7", None, None, 5, True),
    ]
    assert all(h.address == h.name for h in hosts)


def test_hostfile_from_disk_and_hosts_arg(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb slots=2\n")
    assert parse_hostfile(path) == parse_hosts_arg("a:2, b:2")
    assert load_hosts(hosts="root@x:3")[0] == Host("x", user="root", slots=3, slots_given=True)
    assert format_hostfile(parse_hosts_arg("a:2,b")) == "a slots=2\nb slots=1\n"
    resolved = [h.with_address("10.0.0.9") for h in parse_hosts_arg("a:3")]
    assert format_hostfile(resolved, use_alias=False) == "10.0.0.9 slots=3\n"


@pytest.mark.parametrize("text, line, words", [
    ("a slots=2\nb slots=0\n", 2, "slots=0"),
    ("a\n\n# c\nb:0\n", 4, "slots=0"),
    ("a slots=2\nb\na slots=1\n", 3, "listed twice (first at hostfile line 1)"),
    ("a\nb:3\nA:2\n", 3, "listed twice"),
    ("a\nnode 4\n", 2, "cannot read '4'"),
    ("a\nb slots=x\n", 2, "whole number"),
    ("a\nb gpus=2\n", 2, "unknown option 'gpus'"),
    ("a\nb slots=2 slots=3\n", 2, "given twice"),
    ("a\nbad_host!\n", 2, "cannot read host"),
    ("a\nb:99999 slots=1\n", 2, "port 99999 out of range"),
])
def test_hostfile_errors_name_the_line(text, line, words):
    with pytest.raises(UsageError) as info:
        parse_hostfile_text(text)
    assert f"hostfile line {line}:" in info.value.message
    assert words in info.value.message
    assert info.value.hint and info.value.exit_code == 2


def test_hosts_arg_and_file_errors(tmp_path):
    with pytest.raises(UsageError, match="--hosts entry 2: empty"):
        parse_hosts_arg("a:2,,b")
    with pytest.raises(UsageError, match="--hosts entry 3: host a is listed twice"):
        parse_hosts_arg("a:2,b:2,a:1")
    with pytest.raises(UsageError, match="lists no hosts"):
        parse_hostfile_text("# nothing\n\n")
    with pytest.raises(UsageError, match="not found"):
        parse_hostfile(tmp_path / "missing")
    with pytest.raises(UsageError, match="both given"):
        load_hosts(hostfile="x", hosts="y")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="cannot read hostfile"):
        parse_hostfile(tmp_path / "bin")


CONFIG = """
Host node1
    HostName 10.1.0.1
    Port 2201
    User trainer
    IdentityFile ~/.ssh/cluster_key
    UserKnownHostsFile /etc/cluster/known_hosts ~/.ssh/known_cluster
    StrictHostKeyChecking accept-new
    ConnectTimeout 3

Host inner
    HostName 10.2.0.9
    ProxyJump jumpuser@bastion:2022,node1

Host node*
    User fallback

Host *
    StrictHostKeyChecking yes
"""


def test_ssh_config_resolution(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(CONFIG)
    config = load_config(cfg)
    t = resolve(Host("node1"), config)
    home = os.path.expanduser("~")
    assert (t.hostname, t.port, t.user) == ("10.1.0.1", 2201, "trainer")
    assert t.identity_files == (f"{home}/.ssh/cluster_key",)
    assert t.known_hosts_files == ("/etc/cluster/known_hosts", f"{home}/.ssh/known_cluster")
    assert t.strict_host_key_checking == "accept-new" and t.accepts_new_keys
    assert t.connect_timeout == 3.0 and t.key_name == "[10.1.0.1]:2201"
    # the hostfile's own user@ and :port win over the config, as on the ssh command line
    t = resolve(Host("node1", user="me", port=22), config)
    assert (t.user, t.port, t.key_name) == ("me", 22, "10.1.0.1")
    # an unlisted host: defaults, strict checking from "Host *", refused unless accept_new
    t = resolve(Host("other"), config)
    assert (t.hostname, t.port, t.user) == ("other", 22, getpass.getuser())
    assert not t.accepts_new_keys
    assert t.known_hosts_files == (f"{home}/.ssh/known_hosts", f"{home}/.ssh/known_hosts2")
    assert resolve(Host("other"), config, accept_new=True).accepts_new_keys
    # ProxyJump: a chain of hops, each resolved through the same config
    t = resolve(Host("inner"), config)
    assert [(h.alias, h.hostname, h.port, h.user) for h in t.proxy_jump] == [
        ("bastion", "bastion", 2022, "jumpuser"), ("node1", "10.1.0.1", 2201, "trainer")]
    # OpenSSH's default for an unset StrictHostKeyChecking is "ask": refused here
    assert not resolve(Host("x"), paramiko.SSHConfig()).accepts_new_keys


def test_resolve_hosts_sets_addresses_and_refuses_two_names_for_one_node(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(CONFIG + "\nHost alias1\n    HostName 10.1.0.1\n    Port 2201\n")
    hosts, targets = resolve_hosts(parse_hosts_arg("node1:2,inner:2"), cfg)
    assert [(h.name, h.address, h.port) for h in hosts] == [("node1", "10.1.0.1", 2201),
                                                            ("inner", "10.2.0.9", 22)]
    assert targets["inner"].hostname == "10.2.0.9"
    with pytest.raises(UsageError, match="node1 and alias1 both reach 10.1.0.1:2201"):
        resolve_hosts(parse_hosts_arg("node1,alias1"), cfg)
    with pytest.raises(UsageError, match="ssh config .* not found"):
        resolve_hosts(parse_hosts_arg("a"), tmp_path / "nope")


def test_a_host_is_a_value():
    """Host is a plain immutable class (dataclasses cost cluster sync ~6 ms to import): equal by
    its fields, hashable, changed only through replace(), and copied or pickled whole."""
    import copy
    import pickle
    host = Host("n1", port=2222, user="bob", slots=4, slots_given=True)
    assert host.address == "n1" and host == Host("n1", "n1", 2222, "bob", 4, True)
    assert len({host, Host("n1", port=2222, user="bob", slots=4, slots_given=True)}) == 1
    with pytest.raises(AttributeError):
        host.slots = 8
    moved = host.with_address("10.0.0.1")
    assert (moved.address, moved.port, moved.user, host.address) == ("10.0.0.1", 2222, "bob", "n1")
    assert host.replace(slots=8).slots == 8 and host.slots == 4
    assert copy.deepcopy(host) == pickle.loads(pickle.dumps(host)) == host
    assert repr(host).startswith("Host(name='n1', address='n1', port=2222")


# The regexes the hand-written readers replaced (fluidctl.planning.hosts imported re for them):
# the grammar's specification, and the oracle the readers are held to.
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?"
HOST_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.\-]*)@)?"
                     r"(?:\[(?P<ipv6>[0-9A-Fa-f:.%]+)\]|(?P<name>" + _NAME + r"))"
                     r"(?::(?P<number>\d+))?$")
OPTION_RE = re.compile(r"^(?P<key>[A-Za-z_\-]+)=(?P<value>\S*)$")
TRICKY = "aZ09_.-@[]:%=fF\n\t \u0663\u00e9\u00b2x"      # Arabic-Indic 3, e-acute, superscript 2

# Strings the regexes match, built from their pieces: st.from_regex draws the same language at
# ~15 ms an example (most of these tests' time); these take well under one.
_FIRST = "ABCXYZabcxyz0189_"                                # [A-Za-z0-9_]
_INNER = _FIRST + ".-"                                      # [A-Za-z0-9_.\-]
_DIGIT = st.characters(categories=["Nd"])                   # \d is any Unicode decimal digit
_NAMES = st.builds(lambda a, mid: a + mid, st.sampled_from(_FIRST),
                   st.one_of(st.just(""), st.builds(lambda m, z: m + z, st.text(_INNER, max_size=6),
                                                    st.sampled_from(_FIRST))))
_USERS = st.builds(lambda a, rest: a + rest + "@", st.sampled_from(_FIRST), st.text(_INNER, max_size=6))
_IPV6 = st.text("0123456789abcdefABCDEF:.%", min_size=1, max_size=10).map(lambda t: f"[{t}]")
_PORTS = st.text(_DIGIT, min_size=1, max_size=5).map(lambda d: ":" + d)
HOSTS = st.builds(lambda user, host, port: user + host + port, st.one_of(st.just(""), _USERS),
                  st.one_of(_NAMES, _IPV6), st.one_of(st.just(""), _PORTS))
OPTIONS = st.builds(lambda key, value: f"{key}={value}",
                    st.text("ABCXYZabcxyz_-", min_size=1, max_size=8),
                    st.text(st.characters().filter(lambda c: not c.isspace()), max_size=6))


@settings(max_examples=300, deadline=None)     # ~10 ms an example: generation, not the reader
@given(st.one_of(st.text(alphabet=TRICKY, max_size=14),
                 HOSTS))
@example("node1:\u00b2")      # a superscript is a digit to isdigit(), not to the regex's \d
@example("node1:\u0663")      # an Arabic-Indic three is one to both
@example("bob@node1:4\n")     # '$' let one final newline through
@example("[fe80::1%eth0]:22")
@example("a@b@c")
def test_the_host_reader_agrees_with_the_regex_it_replaced(text):
    match = HOST_RE.match(text)
    expected = (match["user"], match["ipv6"], match["name"], match["number"]) if match else None
    assert hosts.split_host(text) == expected


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(alphabet=TRICKY, max_size=10),
                 OPTIONS))
@example("slots=4\n")
@example("slots=4\u00a0")    # a no-break space is whitespace to \S
@example("max-slots==2")
def test_the_option_reader_agrees_with_the_regex_it_replaced(text):
    match = OPTION_RE.match(text)
    assert hosts.split_option(text) == ((match["key"], match["value"]) if match else None)
