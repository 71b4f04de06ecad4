"""The launcher's one SSH-channel reader (fluidctl/remote/pump.py) against channels whose
descriptors behave as paramiko's do: a pipe per channel, closed with the channel. A channel
closed behind the pump's back leaves its descriptor number free for the next channel: the
pump must go on reading (its thread died on the reused number, and every later job in that
process heard nothing from its nodes)."""
import os
import threading

from fluidctl.remote.pump import ChannelPump


class PipeChannel:
    """paramiko.Channel's surface the pump uses, over a pipe: ``fileno()`` turns readable
    when data comes; ``close()`` closes it."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.closed = self.eof_received = False
        self.data = b""

    def fileno(self):
        return self.r

    def send(self, data: bytes):
        self.data += data
        os.write(self.w, b"!")

    def finish(self):
        self.eof_received = True
        os.write(self.w, b"!")

    def recv_ready(self):
        return bool(self.data)

    def recv(self, n):
        if not self.closed:           # paramiko clears its pipe; a closed one it never touches
            os.read(self.r, 4096)
        out, self.data = self.data[:n], self.data[n:]
        return out

    def recv_stderr_ready(self):
        return False

    def get_transport(self):
        return self

    def is_active(self):
        return not self.closed

    def close(self):
        self.closed = True
        os.close(self.r)
        os.close(self.w)


def _read(pump, channel):
    got, ended = [], threading.Event()
    done = pump.read(channel, got.append, got.append, ended.set)
    return got, done


def test_a_channel_closed_behind_its_back_does_not_stop_the_pump():
    pump = ChannelPump()
    old = PipeChannel()
    _read(pump, old)
    old.send(b"hello")
    old.close()                                   # its descriptor number is free again
    new = PipeChannel()
    got, done = _read(pump, new)
    new.send(b"from the next job")
    new.finish()
    assert done.wait(10), "the pump stopped reading"
    assert b"".join(got) == b"from the next job"
    new.close()


def test_many_channels_in_turn_each_read_to_their_end():
    pump = ChannelPump()
    for n in range(20):
        channel = PipeChannel()
        got, done = _read(pump, channel)
        channel.send(b"line %d" % n)
        if n % 2:
            channel.close()                       # closed by the launcher, not ended
            continue
        channel.finish()
        assert done.wait(10), n
        assert b"".join(got) == b"line %d" % n
        channel.close()


def test_a_channels_end_and_an_exit_status_run_the_end_checks_at_once(monkeypatch):
    """A job's last agent exiting is seen then, not up to a tick later: with ticks 30 s apart,
    the end checks still run within seconds of a channel's end, and of a poke (what paramiko's
    exit-status request does, fluidctl/remote/ssh.py)."""
    from fluidctl.remote import pump as pump_module
    monkeypatch.setattr(pump_module, "TICK", 30.0)
    pump = ChannelPump()
    checked = threading.Event()
    pump.every_tick(lambda now: checked.set() or True)
    channel = PipeChannel()
    _, done = _read(pump, channel)
    assert not checked.wait(0.3)                  # no tick yet: they are 30 s apart
    channel.finish()
    assert done.wait(10) and checked.wait(5), "the end checks waited for the next tick"
    checked.clear()
    pump.poke()
    assert checked.wait(5), "a poke did not run the end checks"
    channel.close()
