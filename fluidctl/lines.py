"""Turn a byte stream into lines: incremental UTF-8 decoding (a character split across two
reads is not garbled), ``\\r\\n``, ``\\n`` and a lone ``\\r`` (progress bars) all end a line."""
from __future__ import annotations

import codecs
from typing import Callable


class LineSplitter:
    def __init__(self, on_line: Callable[[str], None]):
        self.on_line = on_line
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""

    def feed(self, data: bytes) -> None:
        text = self._pending + self._decoder.decode(data)
        start = 0
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\n" or ch == "\r":
                if ch == "\r" and i + 1 == len(text):
                    break                       # maybe the first half of \r\n: wait
                self.on_line(text[start:i])
                if ch == "\r" and text[i + 1] == "\n":
                    i += 1
                start = i + 1
            i += 1
        self._pending = text[start:]

    def close(self) -> None:
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        if text.endswith("\r"):
            text = text[:-1]
        if text:
            self.on_line(text)
