"""Turn a byte stream into lines: incremental UTF-8 decoding (a character split across two
reads is not garbled), ``\\r\\n``, ``\\n`` and a lone ``\\r`` (progress bars) all end a line.

Linear in the input however it is cut: only new text is scanned (by a regex, in C), and an
unfinished line is kept as a list of pieces joined once when it ends (a worker writing 500 MiB
without a newline used to cost time quadratic in its size). ``max_line`` (characters) cuts a
longer line into pieces, so a reader that only displays lines holds bounded memory.
"""
from __future__ import annotations

import codecs
import re
from typing import Callable, List, Optional

_EOL = re.compile(r"\r\n|\r|\n")


class LineSplitter:
    def __init__(self, on_line: Callable[[str], None], max_line: Optional[int] = None):
        self.on_line = on_line
        self.max_line = max_line
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: List[str] = []      # the unfinished line
        self._size = 0
        self._after_cr = False           # the last text ended with \r: a \n next belongs to it

    def _emit(self, piece: str) -> None:
        if self._parts:
            self._parts.append(piece)
            piece = "".join(self._parts)
            self._parts, self._size = [], 0
        self.on_line(piece)

    def _text(self, text: str) -> None:
        if self._after_cr and text:
            self._after_cr = False
            if text[0] == "\n":
                text = text[1:]
        start = 0
        for m in _EOL.finditer(text):
            self._emit(text[start:m.start()])
            start = m.end()
        if text.endswith("\r"):
            self._after_cr = True
        rest = text[start:]
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
            if self.max_line and self._size >= self.max_line:
                line = "".join(self._parts)
                self._parts, self._size = [], 0
                for pos in range(0, len(line) - self.max_line + 1, self.max_line):
                    self.on_line(line[pos:pos + self.max_line])
                tail = line[len(line) - len(line) % self.max_line:]
                if tail:
                    self._parts, self._size = [tail], len(tail)

    def feed(self, data: bytes) -> None:
        self._text(self._decoder.decode(data))

    def close(self) -> None:
        self._text(self._decoder.decode(b"", final=True))
        if self._parts:
            self._emit("")
