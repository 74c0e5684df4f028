"""Sets of ranks in words: which ranks of a world size are missing, named in a message
without walking a world size of a million (a job's value) for a handful of parts."""

from __future__ import annotations

SHOWN = 20  # missing ranks named in a message


def missing_ranks(world_size: int, ranks, limit: int | None = None) -> list[int]:
    """The ranks below world_size not in `ranks`, the first `limit` of them. Looks at no
    more than len(ranks) + limit ranks: a job's world size (up to 2^20) costs nothing
    until its parts exist."""
    reported = set(ranks)
    found: list[int] = []
    for rank in range(world_size):
        if rank not in reported:
            found.append(rank)
            if limit is not None and len(found) >= limit:
                break
    return found


def describe_ranks(ranks: list[int], total: int | None = None) -> str:
    """'rank 3', 'ranks 17, 40', 'ranks 0, 1, ... and 44 more' (`total`: how many there
    are when `ranks` holds the first of them only)."""
    total = len(ranks) if total is None else total
    shown = ", ".join(str(r) for r in ranks[:SHOWN])
    more = f" and {total - min(SHOWN, len(ranks)):,} more" if total > SHOWN else ""
    return f"{'rank' if total == 1 else 'ranks'} {shown}{more}"


def _missing(world_size: int, ranks) -> tuple[str, int]:
    reported = len({r for r in ranks if r < world_size})
    first = missing_ranks(world_size, ranks, SHOWN)
    return describe_ranks(first, world_size - reported), reported


def waiting_message(world_size: int, ranks) -> str:
    named, reported = _missing(world_size, ranks)
    return f"{reported} of {world_size} ranks reported their part; waiting for {named}"


def incomplete_message(world_size: int, ranks) -> str:
    named, reported = _missing(world_size, ranks)
    return f"incomplete: {named} never reported ({reported} of {world_size} parts); never checked"
