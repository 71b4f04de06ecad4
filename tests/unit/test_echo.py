"""The console echo (launch/echo.py) cuts lines with the one LineSplitter, however the bytes
arrive: UTF-8 characters, \\r\\n and lone \\r split across reads."""
import io

import pytest

from fluidctl.launch.echo import LogEcho, _Source
from fluidctl.lines import LineSplitter


def feed_in_pieces(tmp_path, pieces):
    """Append ``pieces`` to a log one at a time, reading what is complete after each."""
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"")
    src = _Source(str(log), "")
    lines = []
    for piece in pieces:
        with open(log, "ab") as f:
            f.write(piece)
        lines += src.read_lines()[0]
    lines += src.read_lines(final=True)[0]
    src.close()
    return lines


@pytest.mark.parametrize("pieces, expected, echoed", [
    ([b"a\r", b"\nb\n"], ["a", "b"], None),                 # \r\n split across reads
    ([b"a\r\n", b"b\r", b"\n"], ["a", "b"], None),
    # progress bars: every state is a line for the SSH readers, the echo shows the last one
    ([b"50%\r", b"100%\rdone\n"], ["50%", "100%", "done"], ["done"]),
    ([b" 1/3\r 2/3\r", b" 3/3\r", b"\nnext\n"], [" 1/3", " 2/3", " 3/3", "next"],
     [" 3/3", "next"]),
    ([b"10%\r20%\r", b"30%"], ["10%", "20%", "30%"], ["30%"]),   # unfinished at the end
    (["é€\n".encode()[:1], "é€\n".encode()[1:4], "é€\n".encode()[4:]], ["é€"], None),
    ([b"x\n", b"no newline at the end"], ["x", "no newline at the end"], None),
    ([b"", b"\n\n"], ["", ""], None),                        # empty lines stay empty lines
])
def test_lines_split_across_reads(tmp_path, pieces, expected, echoed):
    assert feed_in_pieces(tmp_path, pieces) == (expected if echoed is None else echoed)
    got = []
    splitter = LineSplitter(got.append)        # the same cuts as the SSH output readers make
    for piece in pieces:
        splitter.feed(piece)
    splitter.close()
    assert got == expected


def test_echo_prefixes_lines_of_each_source(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"one\r\ntwo")
    b.write_bytes(b"three\n")
    out = io.StringIO()
    echo = LogEcho([(str(a), "[trainer 0] "), (str(b), "[trainer 1] ")], out)
    echo.start()
    echo.finish()
    lines = out.getvalue().splitlines()       # a last partial line comes out at the end
    assert [l for l in lines if l.startswith("[trainer 0]")] == ["[trainer 0] one",
                                                                "[trainer 0] two"]
    assert [l for l in lines if l.startswith("[trainer 1]")] == ["[trainer 1] three"]


def test_an_idle_log_is_opened_again_where_it_was_left(tmp_path, monkeypatch):
    """On NFS only an open() sees what a rank on another node appended (close-to-open
    consistency), so an idle source lets its file go and reopens it at the same offset: no
    line lost or repeated, a line cut by the reopen joined."""
    from fluidctl.launch import echo
    monkeypatch.setattr(echo, "REOPEN_IDLE", 0.0)
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"one\ntw")
    src = _Source(str(log), "")
    assert src.read_lines()[0] == ["one"]
    assert src.read_lines()[0] == [] and src.file is None        # idle: let go
    with open(log, "ab") as f:
        f.write(b"o\nthree\n")
    assert src.read_lines()[0] == ["two", "three"] and src.file is not None
    assert src.read_lines(final=True)[0] == []
    src.close()
