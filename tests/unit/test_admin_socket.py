"""The admin socket carries the proxy's own services (introspection, health); the CRI socket, CRI alone.

In-process proxies for the sockets' modes and contents; `cri-proxy serve` and `cri-proxy ctl` as real
processes for the CLI's defaults and errors; a raw HTTP/2 client (the `h2` library) for what the
CRI socket does before any request: the runtime's SETTINGS and ACK, PING answers, no idle GOAWAY.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import h2.events
import pytest

from cri_proxy.config import Config
from cri_proxy.daemon.admin import AdminServer
from cri_proxy.errors import ConfigError, EndpointError
from tests.h2raw import VERSION, H2Client
from tests.processes import CLI, serve_command, start_fake_runtime, start_proxy, stop
from tests.unit.enforce_support import node

HEALTH = "/grpc.health.v1.Health/Check"
SERVING = b"\x08\x01"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _until(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# -- the sockets of an in-process proxy ---------------------------------------------------------


@pytest.mark.parametrize("relay_mode", ["frames", "grpc"])
def test_admin_socket_serves_the_proxy_and_the_cri_socket_only_cri(tmp_path: Path, relay_mode: str) -> None:
    async def main() -> None:
        async with node(tmp_path, relay_mode=relay_mode) as n:
            admin = tmp_path / "admin.sock"
            assert n.proxy.config.admin_endpoint == f"unix://{admin}"
            st = admin.stat()
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            assert st.st_uid == os.geteuid()
            _, ids = await n.run_pod("p1", qos="burstable")  # through the CRI socket, hooked
            rows = await n.introspect("Cpusets")  # on the admin socket
            assert {row["id"] for row in rows} == set(ids.values()) and all(r["decided"] for r in rows)
            check = n.admin.unary_unary(HEALTH)

            async def serving() -> bool:
                return bool(await check(b"", timeout=5) == SERVING)

            await _until(serving, "health SERVING on the admin socket")
            # the CRI socket answers CRI only: the runtime behind it knows no such services
            for path in ("/cri_proxy.v1.Introspect/Cpusets", HEALTH):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await n.channel.unary_unary(path)(b"", timeout=5)
                assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert not admin.exists() and not (tmp_path / "proxy.sock").exists()

    run(main())


def _other_group() -> grp.struct_group:
    """A group this process may give a file to: any but our own when root, else one of ours."""
    if os.geteuid() == 0:
        return next(g for g in grp.getgrall() if g.gr_gid != os.getegid())
    return grp.getgrgid(os.getgroups()[-1] if os.getgroups() else os.getegid())


def test_admin_socket_group_opens_it_to_that_group(tmp_path: Path) -> None:
    group = _other_group()

    async def main() -> None:
        admin = tmp_path / "ctl" / "admin.sock"
        async with node(tmp_path, admin_listen=f"unix://{admin}", admin_socket_group=group.gr_name) as n:
            st = admin.stat()
            assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
            assert isinstance(await n.introspect("Status"), dict)
        assert not admin.exists()

    run(main())


def test_admin_endpoint_is_beside_listen_unless_given() -> None:
    assert Config().admin_endpoint == "unix:///run/cri-proxy/admin.sock"
    assert Config(listen="unix:///tmp/x/cri.sock").admin_endpoint == "unix:///tmp/x/admin.sock"
    assert Config(listen="/tmp/y/cri.sock").admin_endpoint == "unix:///tmp/y/admin.sock"
    given = Config(admin_listen="unix:///srv/a.sock").validate()
    assert given.admin_endpoint == "unix:///srv/a.sock"
    for bad, words in (
        ("127.0.0.1:9000", "must be a unix:// socket"),
        ("unix:relative.sock", "absolute path"),
        ("unix:///run/cri-proxy/cri-proxy.sock", "must differ from listen"),
    ):
        with pytest.raises(ConfigError) as err:
            Config(admin_listen=bad).validate()
        assert str(err.value).startswith("admin_listen: ") and words in str(err.value)
    with pytest.raises(ConfigError, match="must differ from listen"):
        Config(listen="unix:///tmp/z/admin.sock").validate()


def test_admin_socket_file_rules_are_the_cri_socket_rules(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"

    async def make() -> AdminServer:  # a grpc.aio server needs a running loop
        return AdminServer(Config(listen=f"unix://{tmp_path}/cri.sock").validate(), ())

    admin = run(make())
    path.write_text("not a socket")
    with pytest.raises(EndpointError, match="exists and is not a socket"):
        admin.check()
    assert path.read_text() == "not a socket"  # refused, never deleted
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EndpointError, match="symlink"):
        admin.check()
    path.unlink()
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(path))
        live.listen()
        with pytest.raises(EndpointError, match="already listening"):
            admin.check()
    assert path.exists()  # stale now: its server is gone
    admin.check()
    assert not path.exists()


def test_serve_refuses_an_admin_path_in_use_and_a_bad_group(tmp_path: Path) -> None:
    fake, runtime = start_fake_runtime(tmp_path)
    try:
        (tmp_path / "admin.sock").write_text("mine")
        out = subprocess.run(serve_command(tmp_path, runtime), capture_output=True, text=True, timeout=30)
        assert out.returncode == 1
        assert f"refusing to listen on {tmp_path}/admin.sock: it exists and is not a socket" in out.stderr
        (tmp_path / "admin.sock").unlink()
        config = tmp_path / "config.toml"
        config.write_text('admin_socket_group = "no-such-group-here"\n')
        out = subprocess.run(
            serve_command(tmp_path, runtime, config=config), capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 1
        assert "admin_socket_group: no group named 'no-such-group-here'" in out.stderr
        assert not (tmp_path / "admin.sock").exists() and not (tmp_path / "proxy.sock").exists()
    finally:
        stop(fake)


# -- the CRI socket before any request, with a raw HTTP/2 client --------------------------------


@pytest.fixture
def proxy_process(tmp_path: Path) -> Iterator[Path]:
    fake, runtime = start_fake_runtime(tmp_path)
    try:
        proc, sock = start_proxy(tmp_path, runtime, "--dry-run")
        try:
            yield sock
        finally:
            stop(proc)
    finally:
        stop(fake)


def test_settings_acked_and_ping_answered_before_any_request(proxy_process: Path) -> None:
    with H2Client(proxy_process) as client:
        client.conn.ping(b"12345678")
        client.flush()
        client.wait_for_event(h2.events.RemoteSettingsChanged)  # the runtime's SETTINGS
        client.wait_for_event(h2.events.SettingsAcknowledged)  # ... and its ACK of ours
        ack = client.wait_for_event(h2.events.PingAckReceived)
        assert isinstance(ack, h2.events.PingAckReceived) and ack.ping_data == b"12345678"
        assert client.goaway is None and not client.closed
        call = client.call(VERSION)
        assert call.grpc_status == 0 and call.data  # the runtime's VersionResponse


def test_an_idle_connection_is_not_closed_by_the_proxy(proxy_process: Path) -> None:
    """No request for longer than the old 10 s first-request timeout: no GOAWAY, still usable."""
    with H2Client(proxy_process) as client:
        client.wait_for_event(h2.events.SettingsAcknowledged)
        client.listen(11.0)  # reads all along: whatever the proxy sends is seen
        assert client.goaway is None and not client.closed
        assert client.call(VERSION).grpc_status == 0


# -- ctl finds the admin socket -----------------------------------------------------------------


def _ctl(*args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    base = {"CRI_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [CLI, "ctl", *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})}, **kw
    )


def test_ctl_proxy_views_use_the_admin_socket(tmp_path: Path) -> None:
    fake, runtime = start_fake_runtime(tmp_path)
    try:
        sock = tmp_path / "run" / "cri.sock"
        other = tmp_path / "elsewhere" / "ctl.sock"
        proc, _ = start_proxy(
            tmp_path, runtime, "--dry-run", "--admin-listen", f"unix://{other}", listen=sock
        )
        try:
            assert stat.S_IMODE(other.stat().st_mode) == 0o600
            # the default (admin.sock beside the runtime endpoint) is not where this proxy listens
            out = _ctl("-r", f"unix://{sock}", "cpusets")
            assert out.returncode == 1 and out.stdout == ""
            lines = out.stderr.strip().splitlines()
            assert (
                len(lines) == 1
                and f"cannot reach the proxy's admin socket {sock.parent}/admin.sock" in lines[0]
            )
            for args, env in (
                (["--admin-endpoint", f"unix://{other}"], None),
                ([], {"CRI_PROXY_ADMIN_ENDPOINT": f"unix://{other}"}),
            ):
                for view in (["cpusets", "-o", "json"], ["status"], ["plan"], ["pools"], ["problems"]):
                    out = _ctl("-r", f"unix://{sock}", *args, *view, env=env)
                    assert out.returncode == 0, out.stderr
                assert (
                    json.loads(_ctl("-r", f"unix://{sock}", *args, "cpusets", "-o", "json", env=env).stdout)
                    == []
                )
            # CRI commands still go to the runtime endpoint
            assert _ctl("-r", f"unix://{sock}", "version").returncode == 0
            # the CRI socket is no admin socket
            out = _ctl("--admin-endpoint", f"unix://{sock}", "status")
            assert out.returncode == 1 and "is not a cri-proxy admin socket" in out.stderr
        finally:
            assert stop(proc) == 0
        assert not other.exists() and not sock.exists()
    finally:
        stop(fake)


def _as_nobody(endpoint: str) -> str | None:
    """`admin_trouble(endpoint)` as seen by user and group 65534 (a forked child that drops root)."""
    from cri_proxy.ctl.proxy import admin_trouble

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, json.dumps(admin_trouble(endpoint)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    result: str | None = json.loads(answer)
    return result


def test_ctl_default_admin_socket_and_permission_denied(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: asks as another user")
    open_dir = Path(tempfile.mkdtemp(prefix="cri-proxy-admin-", dir="/tmp"))  # others may traverse it
    open_dir.chmod(0o755)
    fake, runtime = start_fake_runtime(tmp_path)
    try:
        sock = open_dir / "cri.sock"
        endpoint = f"unix://{open_dir}/admin.sock"
        proc, _ = start_proxy(tmp_path, runtime, "--dry-run", listen=sock)
        try:
            out = _ctl("-r", f"unix://{sock}", "status", "-o", "json")  # admin.sock beside it, by default
            assert out.returncode == 0 and "containers" in json.loads(out.stdout), out.stderr
            trouble = _as_nobody(endpoint)
            assert trouble is not None
            assert trouble.startswith(f"permission denied on the proxy's admin socket {open_dir}/admin.sock")
            assert "admin_socket_group" in trouble
        finally:
            assert stop(proc) == 0
        config = tmp_path / "group.toml"
        config.write_text(f'admin_socket_group = "{grp.getgrgid(65534).gr_name}"\n')
        proc, _ = start_proxy(tmp_path, runtime, "--dry-run", listen=sock, config=config)
        try:
            assert _as_nobody(endpoint) is None  # the group may
        finally:
            assert stop(proc) == 0
    finally:
        stop(fake)
        shutil.rmtree(open_dir, ignore_errors=True)


# -- what stayed: the CRI socket's own behaviour ------------------------------------------------


def test_not_http2_is_refused_by_the_runtime(proxy_process: Path) -> None:
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(str(proxy_process))
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        while raw.recv(4096):  # until the runtime (through the relay) closes it
            pass


def test_runtime_unreachable_cri_fails_unavailable_while_the_admin_socket_answers(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            await n.fake.stop(0)
            async with grpc.aio.insecure_channel(f"unix://{tmp_path}/proxy.sock") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary(VERSION)(b"", timeout=5)
                assert err.value.code() is grpc.StatusCode.UNAVAILABLE
                assert "not reachable" in (err.value.details() or "")
            assert isinstance(await n.introspect("Cpusets"), list)

    run(main())


def test_a_proxy_out_of_descriptors_says_so_not_that_the_runtime_is_gone(tmp_path: Path) -> None:
    """A dial that fails with EMFILE is the proxy's own limit (daemon/fds.py warns of it): the
    caller's UNAVAILABLE names that, not an unreachable runtime that is in fact fine."""

    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            loop = asyncio.get_running_loop()

            async def emfile(*args: object, **kwargs: object) -> None:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

            loop.create_unix_connection = emfile  # type: ignore[method-assign,assignment]
            try:
                async with grpc.aio.insecure_channel(f"unix://{tmp_path}/proxy.sock") as ch:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await ch.unary_unary(VERSION)(b"", timeout=5)
            finally:
                del loop.create_unix_connection
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            details = err.value.details() or ""
            assert "out of file descriptors" in details and "Too many open files" in details, details
            assert "not reachable" not in details
            assert isinstance(await n.introspect("Cpusets"), list)

    run(main())
