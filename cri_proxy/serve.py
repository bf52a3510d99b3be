"""Wire the proxy together: relay + (later) hooks, state, reconciler. The only place that knows all."""

from __future__ import annotations

from cri_proxy.config import Config
from cri_proxy.relay.hooks import HookTable
from cri_proxy.relay.server import Relay, run_until_signalled


async def serve(config: Config) -> None:
    hooks = HookTable()
    relay = Relay(config, hooks)
    await run_until_signalled(relay)
