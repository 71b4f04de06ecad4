"""Hypothesis fuzzing of the wire decoder (issue 13): whatever bytes a peer sends, decoding
ends in a frame or a WireError (PeerClosed and AuthError are WireErrors), never another
exception, never a hang, never a buffer past the limits. A bounded number of examples each."""
import socket
import struct

import msgpack
from hypothesis import HealthCheck, given, settings, strategies as st

from fluidctl.runtime import wire

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
MAX_PAYLOAD = 4096

prefixes = st.builds(lambda magic, version, flags, head, payload: struct.pack(
    ">2sBBIQ", magic, version, flags, head, payload),
    st.sampled_from([b"FL", b"XX", b"F\x00"]), st.sampled_from([1, 0, 2, 255]),
    st.integers(0, 255), st.integers(0, 2**32 - 1) | st.integers(0, 64),
    st.integers(0, 2**64 - 1) | st.integers(0, 64))
values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
                      | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=40),
                      lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
# a well-formed prefix + a valid or broken msgpack header + payload, or raw bytes
streams = (st.binary(max_size=300)
           | st.builds(lambda p, rest: p + rest, prefixes, st.binary(max_size=300))
           | st.builds(lambda h, body, cut: (lambda head: (struct.pack(
               ">2sBBIQ", b"FL", 1, 0, len(head), len(body)) + head + body)[:cut])(
               msgpack.packb(h, use_bin_type=True)), values, st.binary(max_size=64),
               st.integers(0, 400)))


def _decode(data: bytes, fn):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        b.settimeout(5)
        try:
            return fn(b)
        except wire.WireError as exc:
            return exc


@FUZZ
@given(streams)
def test_recv_frame_ends_in_a_frame_or_a_wire_error(data):
    result = _decode(data, lambda s: wire.recv_frame(s, max_payload=MAX_PAYLOAD))
    if not isinstance(result, wire.WireError):
        header, payload = result
        assert isinstance(header, dict) and payload.nbytes <= MAX_PAYLOAD


@FUZZ
@given(streams)
def test_the_server_handshake_rejects_every_stranger_in_bounded_time(data):
    """What an unauthenticated peer may send after the hello: anything but the token's MAC
    is refused, by the blocking handshake and by the Acceptor's parser alike."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        try:
            wire.server_handshake(b, "fuzz-token", timeout=2.0)
            raise AssertionError("a random stream authenticated")
        except wire.WireError:
            pass
    try:
        head_len = wire._preauth_prefix(data[:wire.PREFIX.size].ljust(wire.PREFIX.size, b"\0"))
        assert head_len <= wire.PREAUTH_MAX_HEADER
        wire._check_auth("fuzz-token", b"n" * 32, data[wire.PREFIX.size:][:head_len])
        raise AssertionError("a random header authenticated")
    except wire.WireError:
        pass


@settings(FUZZ, max_examples=100)      # ~40 ms an example, most of it drawing them
@given(st.dictionaries(st.text(max_size=10), values, max_size=6), st.binary(max_size=2048))
def test_any_header_and_payload_round_trip(header, payload):
    a, b = socket.socketpair()
    with a, b:
        wire.send_frame(a, header, [payload])
        got, body = wire.recv_frame(b, max_payload=MAX_PAYLOAD)
    assert got == header and bytes(body) == payload
