"""Which process of a launch this is: (rank, world size) under `accelerate launch` or torchrun, and whether it is
the first one, the one that writes (run files, outputs, locks)."""

from __future__ import annotations

import os


def process_group() -> tuple[int, int]:
    """(rank, world size) under `accelerate launch` or torchrun; (0, 1) in a plain process."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """False in every process but the first of a multi-process launch (`accelerate launch`, torchrun): under data-
    parallel generation every process holds all results (eval/backends.py gathers them) and the first one writes."""
    return process_group()[0] == 0
