"""Live console echo of workers' log files.

Workers write straight to their log files, so a worker that prints a lot never waits for the
console; this thread follows the files (like ``tail -f``) and writes whole lines to the
console, one writer, so lines of different ranks are never split or mixed. Lines are cut by
``fluidctl.lines.LineSplitter`` (the one splitter: UTF-8 decoded incrementally, ``\\r\\n``,
``\\n`` each end one line, even when split across reads); a progress bar redrawn with bare
``\\r`` is echoed once, in its last state (the log file keeps every state).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import BinaryIO, Callable, Dict, List, Optional, Tuple

from fluidctl.lines import LineSplitter

CHUNK = 1 << 20
MAX_LINE = 1 << 20      # characters; a longer line is echoed in pieces (bounded memory)
IDLE_WAIT = 0.02
REOPEN_IDLE = 0.5       # an idle file is opened again this often: on NFS only an open sees
                        # what another machine appended (close-to-open consistency)


class _Source:
    def __init__(self, path: str, prefix: str, from_end: bool = False, cr_mark: str = "",
                 size: Optional[int] = None):
        self.path, self.prefix = path, prefix
        self.file: Optional[BinaryIO] = None
        self.where: Optional[str] = None
        self.offset = 0
        self.opened = 0.0
        if from_end:            # measured now, before the writers start, not when first read
            try:                # (``size``: measured before they started)
                self.offset = os.path.getsize(path) if size is None else size
            except OSError:
                pass
        self._lines: List[str] = []
        self.splitter = LineSplitter(self._lines.append, max_line=MAX_LINE,
                                     collapse_cr=not cr_mark, cr_mark=cr_mark)

    def read_lines(self, final: bool = False) -> Tuple[List[str], bool]:
        """Complete lines available now; ``final`` flushes a last line without newline."""
        if self.file is None:
            where = os.fspath(self.path)      # a submitted job's log resolves once it has an id
            if self.where is not None and where != self.where:
                self.offset = 0               # another file now (the next job after a restart)
            try:
                self.file = open(where, "rb")
            except FileNotFoundError:
                return [], False
            self.where = where
            self.file.seek(self.offset)
            self.opened = time.monotonic()
        data = self.file.read(CHUNK)
        self.offset += len(data)
        more = len(data) == CHUNK
        if not data and not final and time.monotonic() - self.opened > REOPEN_IDLE:
            self.file.close()           # a rank on another node writes it (shared LOG_DIR)
            self.file = None
        self.splitter.feed(data)
        if final and not more:
            self.splitter.close()
        lines = self._lines[:]
        del self._lines[:]
        return lines, more

    def close(self):
        if self.file:
            self.file.close()


class _Null:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class LogEcho(threading.Thread):
    """Follow ``sources`` ([(log path, line prefix)]) and copy their lines to ``out``."""

    def __init__(self, sources: List[Tuple[str, str]], out=None,
                 on_broken: Optional[Callable[[], None]] = None, from_end: bool = False,
                 cr_mark: str = "", sizes: Optional[Dict[str, int]] = None):
        """``cr_mark``: pass progress-bar states on, marked (a node agent), instead of
        collapsing them. ``from_end``: echo only what is written after the logs' ``sizes``
        (by path; default: their sizes now)."""
        super().__init__(name="fluidctl-echo", daemon=True)
        self.on_broken = on_broken      # called once when the console (a pipe) goes away
        self.out = out or sys.stdout or _Null()   # stdout closed (>&-): Python made it None
        # (path, prefix) goes to ``out``; (path, prefix, "stderr") to stderr (a rank's stderr
        # stays on fluidctl's stderr, where ``2>/dev/null`` hides it, unless ``out`` was given)
        self.sources = []
        for path, prefix, *stream in sources:
            src = _Source(path, prefix, from_end, cr_mark,
                          sizes.get(os.fspath(path)) if from_end and sizes else None)
            src.out = (sys.stderr or _Null()) if stream == ["stderr"] and out is None \
                else self.out
            self.sources.append(src)
        self.lock = threading.Lock()
        self._done = threading.Event()

    def say(self, text: str) -> None:
        """Write fluidctl's own line without cutting into a worker's line."""
        try:
            with self.lock:
                self.out.write(text + "\n")
                self.out.flush()
        except (OSError, ValueError):   # a broken pipe, a closed or full console
            self._broken()

    def _broken(self) -> None:
        callback, self.on_broken = self.on_broken, None
        if callback:
            callback()

    def _pump(self, final: bool = False) -> bool:
        busy = False
        for src in self.sources:
            more = True
            while more:
                lines, more = src.read_lines(final)
                if lines:
                    busy = True
                    with self.lock:
                        src.out.write("".join(f"{src.prefix}{line}\n" for line in lines))
                        src.out.flush()
        return busy

    def run(self) -> None:
        try:
            while not self._done.is_set():
                if not self._pump():
                    self._done.wait(IDLE_WAIT)
            self._pump(final=True)
        except (OSError, ValueError):  # console went away: logs are still complete
            self._broken()
        finally:
            for src in self.sources:
                src.close()

    def finish(self) -> None:
        """Copy what is left (the last partial line too) and stop."""
        self._done.set()
        if self.is_alive():
            self.join()
