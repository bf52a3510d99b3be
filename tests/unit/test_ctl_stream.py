"""The pure parts of ctl's streaming: port specifications and the final status of a session."""

from __future__ import annotations

import pytest

from cri_proxy.ctl.errors import CtlError
from cri_proxy.ctl.portforward import parse_ports
from cri_proxy.ctl.stream import exit_code


def test_port_specifications() -> None:
    assert parse_ports(["8080:80", "443", ":9000"]) == [(8080, 80), (443, 443), (0, 9000)]


@pytest.mark.parametrize("spec", ["http", "80:", "70000", "1:0", "-1:80"])
def test_bad_port_specifications_name_the_spec(spec: str) -> None:
    with pytest.raises(CtlError, match="invalid port specification"):
        parse_ports([spec])


def test_exit_code_of_a_kubernetes_status() -> None:
    assert exit_code(None) == 0 and exit_code({"status": "Success"}) == 0
    failed = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert exit_code(failed) == 3
    assert exit_code({"status": "Failure", "message": "container not running"}) is None
