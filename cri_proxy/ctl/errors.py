"""The one error type of `cri-proxy ctl`: a message for people and an exit code."""

from __future__ import annotations

from cri_proxy.errors import CriProxyError


class CtlError(CriProxyError):
    """Printed as one line on stderr; the command exits with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
