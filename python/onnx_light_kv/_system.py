"""What the machine has, read from the OS (no native code: the model builders use it too)."""

from __future__ import annotations

import os

__all__ = ["physical_memory"]


def physical_memory() -> int:
    """The machine's memory in bytes (1 TiB where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return 1 << 40
