"""Turn a byte stream into lines: incremental UTF-8 decoding (a character split across two
reads is not garbled), ``\\r\\n``, ``\\n`` and a lone ``\\r`` (progress bars) all end a line.

Linear in the input however it is cut: only new text is scanned (by a regex, in C), and an
unfinished line is kept as a list of pieces joined once when it ends (a worker writing 500 MiB
without a newline used to cost time quadratic in its size). ``max_line`` (characters) cuts a
longer line into pieces, so a reader that only displays lines holds bounded memory.

With ``collapse_cr`` (the console echo), a lone ``\\r`` does not end a line but starts it over,
as a terminal would: a progress bar redrawn a thousand times is one line, its last state.
With ``cr_mark`` (a node agent streaming logs), a line ended by a lone ``\\r`` is passed on with
``cr_mark`` appended, so the launcher can write the ``\\r`` back into its copy of the log.
"""
from __future__ import annotations

import codecs
import re
from typing import Callable, List, Optional

_EOL = re.compile(r"\r\n|\r|\n")


class LineSplitter:
    def __init__(self, on_line: Callable[[str], None], max_line: Optional[int] = None,
                 collapse_cr: bool = False, cr_mark: str = ""):
        self.on_line = on_line
        self.max_line = max_line
        self.collapse_cr, self.cr_mark = collapse_cr, cr_mark
        self._drawn = ""                 # collapse_cr: the last state before a lone \r
        self._held: Optional[str] = None  # a line that ended with \r at the end of the text
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: List[str] = []      # the unfinished line
        self._size = 0
        self._after_cr = False           # the last text ended with \r: a \n next belongs to it

    def _emit(self, piece: str) -> None:
        self.on_line(self._take(piece))

    def _take(self, piece: str) -> str:
        """The unfinished line, ended by ``piece``."""
        if self._parts:
            self._parts.append(piece)
            piece = "".join(self._parts)
            self._parts, self._size = [], 0
        return piece

    def _end(self, line: str, eol: str) -> None:
        """collapse_cr / cr_mark: ``line`` ended with ``eol``."""
        if eol == "\r":
            if self.collapse_cr:
                self._drawn = line or self._drawn        # redrawn: start over
            else:
                self.on_line(line + self.cr_mark)
            return
        if self.collapse_cr:
            line, self._drawn = line or self._drawn, ""
        self.on_line(line)

    def _text(self, text: str) -> None:
        if self.collapse_cr or self.cr_mark:
            self._text_cr(text)
            return
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
        self._keep(text[start:])

    def _keep(self, rest: str) -> None:
        """The unfinished line grows by ``rest``; past ``max_line`` it goes out in pieces."""
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

    def _text_cr(self, text: str) -> None:
        if self._held is not None and text:   # a \r ended the last text: was it \r\n?
            line, self._held = self._held, None
            if text[0] == "\n":
                text = text[1:]
                self._end(line, "\n")
            else:
                self._end(line, "\r")
        start = 0
        for m in _EOL.finditer(text):
            line = self._take(text[start:m.start()])
            start = m.end()
            if m.group() == "\r" and m.end() == len(text):
                self._held = line                # decided by the next text
                continue
            self._end(line, "\n" if m.group() != "\r" else "\r")
        self._keep(text[start:])

    def feed(self, data: bytes) -> None:
        self._text(self._decoder.decode(data))

    def close(self) -> None:
        self._text(self._decoder.decode(b"", final=True))
        if self._held is not None:
            line, self._held = self._held, None
            self._end(line, "\r")
        if self._parts:
            self._end(self._take(""), "\n") if self.collapse_cr or self.cr_mark \
                else self._emit("")
        elif self.collapse_cr and self._drawn:
            self._end("", "\n")
