"""A link core's one pass (a shorter way through its usual read) turned off or counted, for the
tests that hold it to the outcome of the general way."""

from __future__ import annotations

from typing import Any


class OnePass:
    """The core's method `name` (a one pass: True when it took the read) never taken (`on`
    False), or counted in `taken` each time it is."""

    def __init__(self, core: Any, name: str, on: bool) -> None:
        self.taken = 0
        if not on:
            setattr(core, name, lambda *_: False)
            return
        real = getattr(core, name)

        def counted(*args: Any) -> bool:
            took: bool = real(*args)
            self.taken += took
            return took

        setattr(core, name, counted)
