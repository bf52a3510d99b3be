"""SIGHUP: read the settings again and swap them in whole, or keep every running one.

The new file is read (off the event loop), validated, and checked against the node before
anything changes; keys that need a restart keep their running values and are named in the log.
Only then is the one settings object swapped, so a reload is applied entirely or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace

from loguru import logger

from cri_proxy.config import RELOADABLE, Config
from cri_proxy.daemon.notify import notify, reloading
from cri_proxy.errors import CriProxyError
from cri_proxy.settings import Settings
from cri_proxy.threads import in_daemon_thread


def reloadable_part(running: Config, new: Config) -> tuple[Config, list[str]]:
    """`new` with every restart-only key at its running value, and the names of those that differ."""
    fixed = sorted(
        f.name
        for f in fields(Config)
        if f.name not in RELOADABLE and getattr(new, f.name) != getattr(running, f.name)
    )
    return replace(new, **{name: getattr(running, name) for name in fixed}), fixed


class Reloader:
    """`read()` gives the new Config (raises CriProxyError when bad); `check(config)` raises when it
    does not fit the node; `swapped(old, new)` runs after the swap (log set-up, a reconcile pass)."""

    def __init__(
        self,
        settings: Settings,
        read: Callable[[], Config] | None,
        check: Callable[[Config], None],
        swapped: Callable[[Config, Config], None],
    ) -> None:
        self.settings = settings
        self.read = read
        self.check = check
        self.swapped = swapped

    async def reload(self) -> bool:
        """True when the new settings were taken."""
        if self.read is None:
            return False
        notify(reloading())
        try:
            try:
                # a daemon thread: a read from a disk that stopped answering must not hold the exit
                new = await in_daemon_thread(self.read, name="reload")
                self.check(new)
            except CriProxyError as exc:
                logger.error("reload refused, the running configuration stays: {}", exc)
                return False
            new, fixed = reloadable_part(self.settings.current, new)
            if fixed:
                logger.warning("cannot change at run time, restart to apply: {}", ", ".join(fixed))
            old = self.settings.swap(new)
            logger.info("configuration reloaded")
            self.swapped(old, new)
            return True
        finally:
            notify("READY=1")
