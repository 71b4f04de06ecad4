"""This node's IPv4 interfaces, read with libc's ``getifaddrs`` through ctypes.

The node agent reports them in its probe, which is on the path to every job's first rank.
psutil's ``net_if_addrs`` makes the same call, but importing psutil costs 5 ms there; this
module costs ctypes (loaded by the agent anyway) and one call. Where libc has no
``getifaddrs`` (not glibc or musl), psutil answers instead.
"""
from __future__ import annotations

import ctypes
import socket
from typing import Dict, List, Tuple

IFF_RUNNING = 0x40      # <net/if.h>: psutil's "isup" is this flag


class _SockaddrIn(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_ushort),
                ("addr", ctypes.c_ubyte * 4)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p),
                     ("flags", ctypes.c_uint), ("addr", ctypes.POINTER(_SockaddrIn)),
                     ("netmask", ctypes.POINTER(_SockaddrIn)), ("ifu", ctypes.c_void_p),
                     ("data", ctypes.c_void_p)]


def _dotted(sockaddr) -> str:
    return socket.inet_ntoa(bytes(sockaddr.contents.addr))


def ipv4_interfaces() -> Dict[str, List[Tuple[str, str]]]:
    """{name: [(address, netmask)]} of the interfaces that are up (running), IPv4 only, as
    psutil's ``net_if_addrs`` and ``net_if_stats`` would give them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        getifaddrs, freeifaddrs = libc.getifaddrs, libc.freeifaddrs
    except (OSError, AttributeError):
        return _from_psutil()
    head = ctypes.POINTER(_Ifaddrs)()
    if getifaddrs(ctypes.byref(head)) != 0:
        return _from_psutil()
    found: Dict[str, List[Tuple[str, str]]] = {}
    try:
        entry = head
        while entry:
            ifa = entry.contents
            if ifa.addr and ifa.addr.contents.family == socket.AF_INET \
                    and ifa.flags & IFF_RUNNING:
                mask = _dotted(ifa.netmask) if ifa.netmask else "255.255.255.255"
                found.setdefault(ifa.name.decode(errors="replace"), []).append(
                    (_dotted(ifa.addr), mask))
            entry = ifa.next
    finally:
        freeifaddrs(head)
    return found


def _from_psutil() -> Dict[str, List[Tuple[str, str]]]:
    import psutil
    stats = psutil.net_if_stats()
    found: Dict[str, List[Tuple[str, str]]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        v4 = [(a.address, a.netmask or "255.255.255.255") for a in addrs
              if a.family == socket.AF_INET]
        if v4:
            found[name] = v4
    return found
