"""Running a function in several threads at once (`run_together`)."""

from __future__ import annotations


def run_together(target, argument_lists) -> None:
    """target(*arguments) for each list of arguments, each in its own thread, at once;
    returns when all have."""
    import threading

    threads = [threading.Thread(target=target, args=tuple(a)) for a in argument_lists]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
