"""Numbers for people: the one byte formatter (tables, progress, error messages)."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import Optional


def human_bytes(n: Optional[float]) -> str:
    """'512 B', '1.5 KiB' ... 'TiB'; '-' when unknown (None)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
