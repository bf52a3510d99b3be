"""The running settings: one frozen `Config`, swapped whole on reload, read through one holder.

Components are handed `settings.get` (a `Callable[[], Config]`) and read what they need at the
moment they need it, so a reload is one assignment: no component ever sees half of a new file.
"""

from __future__ import annotations

from cri_proxy.config import Config


class Settings:
    def __init__(self, config: Config) -> None:
        self._current = config

    @property
    def current(self) -> Config:
        return self._current

    def get(self) -> Config:
        return self._current

    def swap(self, new: Config) -> Config:
        """Make `new` current in one step; the old settings, for the caller to compare."""
        old, self._current = self._current, new
        return old
