"""Session-wide test settings."""

from __future__ import annotations

import os

from hypothesis import settings

# CI runs the property tests on a fixed sequence of examples, so a red CI always means a change
# broke something, never that chance found an old bug; developers' runs keep exploring.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
