"""The list of nodes a job runs on, read from the hostfile formats users already have.

One line per node, any of::

    node1 slots=4            # OpenMPI / DeepSpeed (max_slots=N is accepted and ignored)
    node2:4                  # horovod
    node3                    # bare host: one slot
    alice@node4 slots=2      # user@host
    node5:2222 slots=2       # host:port, only unambiguous next to slots=
    [fe80::1]:4              # IPv6 in brackets

``--hosts node1:2,node2:2`` on the command line is the horovod form, comma-separated. A mistake
is a UsageError naming the line (or the entry) so the user can fix it at once.
"""
from __future__ import annotations

from fluidctl.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Dict, List, Optional, Tuple

# The host grammar, ``[user@](name|[ipv6])[:number]``, and ``key=value`` options, read by hand
# rather than by regex: importing re would delay ``cluster sync``'s first ssh.
# tests/unit/test_hosts.py holds both readers to the regexes they replace.
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME_CHARS = _WORD | frozenset(".-")
_IPV6_CHARS = frozenset("0123456789abcdefABCDEF:.%")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-")


def split_host(text: str) -> Optional[Tuple[Optional[str], Optional[str], Optional[str],
                                            Optional[str]]]:
    """(user, ipv6, name, number) of ``[user@](name|[ipv6])[:number]``, or None. A name starts
    and ends with a letter, digit or '_' and holds '.' and '-' between; a user starts with one
    of those; the number is decimal digits."""
    if text.endswith("\n"):        # as the regex's '$' allowed
        text = text[:-1]
    user = ipv6 = name = number = None
    if "@" in text:
        user, _, text = text.partition("@")
        if not user or user[0] not in _WORD or not _NAME_CHARS.issuperset(user):
            return None
    if text.startswith("["):
        close = text.find("]")
        if close < 2 or not _IPV6_CHARS.issuperset(text[1:close]):
            return None
        ipv6, rest = text[1:close], text[close + 1:]
    else:
        name, colon, after = text.partition(":")
        if (not name or name[0] not in _WORD or name[-1] not in _WORD
                or not _NAME_CHARS.issuperset(name)):
            return None
        rest = colon + after
    if rest:
        if rest[0] != ":" or not rest[1:].isdecimal():
            return None
        number = rest[1:]
    return user, ipv6, name, number


def split_option(word: str) -> Optional[Tuple[str, str]]:
    """(key, value) of ``key=value`` (key: letters, '_' and '-'; value: no whitespace), or None."""
    if word.endswith("\n"):
        word = word[:-1]
    key, eq, value = word.partition("=")
    if not eq or not key or not _KEY_CHARS.issuperset(key) or any(c.isspace() for c in value):
        return None
    return key, value


_IGNORED_OPTIONS = {"max_slots", "max-slots"}


class Host:
    """One node. ``name`` is what the user wrote (an ssh alias, a name or an address) and names
    its log directory; ``address`` is where it is reached (the ssh config's HostName once
    resolved) and is the address written into the endpoints. Immutable; ``replace`` makes a
    changed copy. (A plain class, not a frozen dataclass: importing dataclasses, which imports
    inspect, would delay ``cluster sync``'s first ssh.)"""
    __slots__ = ("name", "address", "port", "user", "slots", "slots_given")
    FIELDS = __slots__

    def __init__(self, name: str, address: str = "", port: Optional[int] = None,
                 user: Optional[str] = None, slots: int = 1, slots_given: bool = False):
        # port None: the ssh config's Port, else 22; user None: the ssh config's User, else
        # the local user; slots_given False for a bare host (a caller may use --nproc instead)
        values = (name, address or name, port, user, slots, slots_given)
        for field, value in zip(self.FIELDS, values):
            object.__setattr__(self, field, value)

    def __setattr__(self, field, value):
        raise AttributeError(f"Host is immutable: use host.replace({field}=...)")

    def _values(self) -> tuple:
        return tuple(getattr(self, field) for field in self.FIELDS)

    def __eq__(self, other) -> bool:
        return type(other) is Host and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "Host(" + ", ".join(f"{f}={v!r}" for f, v in zip(self.FIELDS, self._values())) + ")"

    def replace(self, **changes) -> "Host":
        values = dict(zip(self.FIELDS, self._values()), **changes)
        return Host(**values)

    def __reduce__(self):           # copy, deepcopy and pickle rebuild it through __init__
        return Host, self._values()

    def with_address(self, address: str, port: Optional[int] = None,
                     user: Optional[str] = None) -> "Host":
        return self.replace(address=address, port=port if port is not None else self.port,
                            user=user if user is not None else self.user)

    def __str__(self) -> str:
        text = f"{self.user}@{self.name}" if self.user else self.name
        return f"{text}:{self.port}" if self.port else text


def _fail(where: str, what: str, hint: str) -> UsageError:
    return UsageError(f"{where}: {what}", hint)


def _slots(where: str, text: str, host: str) -> int:
    if not text.isdigit():
        raise _fail(where, f"slots must be a whole number, got {text!r}",
                    f"write e.g. '{host} slots=2'")
    slots = int(text)
    if slots == 0:
        raise _fail(where, f"{host} has slots=0", f"give every host at least one slot, "
                                                  f"e.g. '{host} slots=1', or remove the line")
    return slots


def parse_entry(text: str, where: str) -> Host:
    """One hostfile line (comment already stripped) or one ``--hosts`` entry."""
    words = text.split()
    parts = split_host(words[0])
    if not parts:
        raise _fail(where, f"cannot read host {words[0]!r}",
                    "write 'host slots=N', 'host:N', 'user@host' or a bare host name")
    user, ipv6, name, number = parts
    name = ipv6 or name
    slots_text = None
    for word in words[1:]:
        option = split_option(word)
        if not option:
            raise _fail(where, f"cannot read {word!r} after host {name}",
                        f"write e.g. '{name} slots=2'")
        key = option[0].lower()
        if key == "slots":
            if slots_text is not None:
                raise _fail(where, "slots= given twice", f"keep one, e.g. '{name} slots=2'")
            slots_text = option[1]
        elif key not in _IGNORED_OPTIONS:
            raise _fail(where, f"unknown option {option[0]!r}",
                        "only slots=N (and max_slots=N, ignored) are understood")
    port = None
    if slots_text is not None:
        slots = _slots(where, slots_text, name)
        if number is not None:          # 'host:2222 slots=4': the number can only be a port
            port = int(number)
            if not 0 < port < 65536:
                raise _fail(where, f"port {port} out of range", "use a port from 1 to 65535")
    elif number is not None:            # 'host:4' is horovod's slots
        slots = _slots(where, number, name)
    else:
        slots = 1
    return Host(name=name, port=port, user=user, slots=slots,
                slots_given=slots_text is not None or number is not None)


def _check_duplicates(entries: List[Tuple[str, Host]]) -> None:
    seen: Dict[Tuple[str, Optional[int]], str] = {}
    for where, host in entries:
        key = (host.name.lower(), host.port)
        if key in seen:
            raise _fail(where, f"host {host.name} is listed twice (first at {seen[key]})",
                        "list each host once and give it all its slots, e.g. "
                        f"'{host.name} slots=4'")
        seen[key] = where


def parse_hostfile_text(text: str, source: str = "hostfile") -> List[Host]:
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            where = f"{source} line {number}"
            entries.append((where, parse_entry(line, where)))
    if not entries:
        raise UsageError(f"{source} lists no hosts", "write one host per line, e.g. 'node1 slots=2'")
    _check_duplicates(entries)
    return [host for _, host in entries]


def parse_hostfile(path) -> List[Host]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise UsageError(f"hostfile {path} not found", "pass --hostfile with an existing file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read hostfile {path}: {exc}",
                         "pass --hostfile with a readable text file") from None
    return parse_hostfile_text(text, source=f"hostfile {path}")


def parse_hosts_arg(text: str) -> List[Host]:
    """``--hosts node1:2,node2:2`` (horovod's -H form; ``user@host`` also allowed)."""
    entries = []
    for number, item in enumerate(text.split(","), start=1):
        item = item.strip()
        where = f"--hosts entry {number}"
        if not item:
            raise _fail(where, "empty entry", "write e.g. --hosts node1:2,node2:2")
        if " " in item:
            raise _fail(where, f"cannot read {item!r}", "write e.g. --hosts node1:2,node2:2")
        entries.append((where, parse_entry(item, where)))
    if not entries:
        raise UsageError("--hosts lists no hosts", "write e.g. --hosts node1:2,node2:2")
    _check_duplicates(entries)
    return [host for _, host in entries]


def load_hosts(hostfile=None, hosts: Optional[str] = None) -> List[Host]:
    """What the CLI calls: exactly one of ``--hostfile`` and ``--hosts``."""
    if hostfile and hosts:
        raise UsageError("--hostfile and --hosts both given", "use one of them")
    if hostfile:
        return parse_hostfile(hostfile)
    if hosts:
        return parse_hosts_arg(hosts)
    raise UsageError("no hosts given", "pass --hostfile FILE or --hosts node1:2,node2:2")


def format_hostfile(hosts: List[Host], use_alias: bool = True) -> str:
    """OpenMPI's hostfile text: ``name slots=N`` per node (the alias, so ``ssh`` resolves it
    through the ssh config; ``use_alias=False`` writes the resolved addresses)."""
    return "".join(f"{h.name if use_alias else h.address} slots={h.slots}\n" for h in hosts)
