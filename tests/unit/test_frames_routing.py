"""relay_mode "frames" with the proxy's own services: each connection is routed by its first request.

A connection whose first call is for introspection or health goes (as a byte pipe) to the proxy's
internal grpc.aio server, which also forwards CRI calls; any other connection is relayed as frames.
"""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from cri_api.v1 import api_pb2 as v1
from cri_proxy.relay import frames as h2
from cri_proxy.relay.server import own_paths
from tests.processes import wait_for_socket
from tests.unit.enforce_support import node

CLI = str(Path(sys.executable).parent / "cri-proxy")
HEALTH = "/grpc.health.v1.Health/Check"
VERSION = "/runtime.v1.RuntimeService/Version"
SERVING = b"\x08\x01"


def _channel(tmp_path: Path) -> grpc.aio.Channel:
    """A channel with a connection of its own (channels in one process share them otherwise)."""
    return grpc.aio.insecure_channel(
        f"unix://{tmp_path}/proxy.sock", options=[("grpc.use_local_subchannel_pool", 1)]
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _version(ch: grpc.aio.Channel) -> Any:
    return ch.unary_unary(
        VERSION,
        request_serializer=v1.VersionRequest.SerializeToString,
        response_deserializer=v1.VersionResponse.FromString,
    )


def test_own_services_and_cri_calls_share_the_socket(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            frames = n.proxy.relay.frames
            assert frames is not None and n.proxy.relay.internal is not None
            internal = Path(n.proxy.relay.internal.path)
            assert internal.parent == tmp_path and internal.name == ".proxy.sock.internal"
            assert stat.S_IMODE(internal.stat().st_mode) == 0o600
            # the node's channel: first call introspection -> the internal server
            cpusets = await n.introspect("Cpusets")
            assert isinstance(cpusets, list)
            assert frames.routed == {"runtime": 0, "internal": 1, "moved": 0}
            # a channel making CRI calls only -> frames relayed to the runtime
            async with _channel(tmp_path) as cri:
                _, ids = await n.run_pod("p1", qos="burstable")  # on the node channel (internal)
                reply = await _version(cri)(v1.VersionRequest(), timeout=5)
                assert reply.runtime_name == "cri-proxy-fake-runtime"
                listed = await cri.unary_unary(
                    "/runtime.v1.RuntimeService/ListContainers",
                    request_serializer=v1.ListContainersRequest.SerializeToString,
                    response_deserializer=v1.ListContainersResponse.FromString,
                )(v1.ListContainersRequest(), timeout=5)
                assert {c.id for c in listed.containers} == set(ids.values())
            assert frames.routed == {"runtime": 1, "internal": 1, "moved": 0}
            # the pod's calls went through the internal forwarder, with its hooks: the proxy knows them
            rows = await n.introspect("Cpusets")
            assert {row["id"] for row in rows} == set(ids.values())
            assert all(row["decided"] for row in rows)
            # health first, then a CRI call on the same channel: answered through the internal forwarder
            async with _channel(tmp_path) as mixed:
                assert await mixed.unary_unary(HEALTH)(b"", timeout=5) == SERVING
                reply = await _version(mixed)(v1.VersionRequest(), timeout=5)
                assert reply.runtime_name == "cri-proxy-fake-runtime"
                watch = mixed.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=5)
                assert await watch.read() == SERVING
                watch.cancel()
            assert frames.routed == {"runtime": 1, "internal": 2, "moved": 0}
        assert not internal.exists()
        assert not (tmp_path / "proxy.sock").exists()

    run(main())


def test_own_service_call_on_a_relayed_connection_is_retried_on_a_new_one(tmp_path: Path) -> None:
    """CRI first, then introspection on the same channel: GOAWAY, and the client retries elsewhere."""

    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            frames = n.proxy.relay.frames
            assert frames is not None
            _, ids = await n.run_pod("first", qos="burstable")  # the connection goes to the runtime
            assert frames.routed == {"runtime": 1, "internal": 0, "moved": 0}
            rows = await n.introspect("Cpusets")  # refused there, retried on a new connection
            assert {row["id"] for row in rows} == set(ids.values())
            assert frames.routed == {"runtime": 1, "internal": 1, "moved": 1}
            # the channel keeps working, CRI included (now through the internal forwarder)
            _, ids2 = await n.run_pod("second", qos="burstable")
            assert n.cpuset(ids2["main"])
            assert len(await n.introspect("Cpusets")) == 2
            # this process was told to retry elsewhere: its new connections go to the internal server
            async with _channel(tmp_path) as ch:
                assert await _version(ch)(v1.VersionRequest(), timeout=5)
            assert frames.routed == {"runtime": 1, "internal": 2, "moved": 1}
            frames.sticky.clear()
            # concurrent CRI calls around an own-service call on a relayed connection: all answered once
            async with _channel(tmp_path) as ch:
                version = _version(ch)
                await version(v1.VersionRequest(), timeout=5)
                calls = [version(v1.VersionRequest(), timeout=5) for _ in range(20)]
                health = ch.unary_unary(HEALTH)(b"", timeout=5)
                calls += [version(v1.VersionRequest(), timeout=5) for _ in range(20)]
                replies = await asyncio.gather(*calls)
                assert all(r.runtime_name == "cri-proxy-fake-runtime" for r in replies)
                assert await health == SERVING
            assert frames.routed["moved"] == 2 and frames.routed["runtime"] == 2

    run(main())


def test_health_answers_through_frames_mode_and_unknown_paths_go_to_the_runtime(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            frames = n.proxy.relay.frames
            assert frames is not None
            async with _channel(tmp_path) as ch:
                assert await ch.unary_unary(HEALTH)(b"", timeout=5) == SERVING
            async with _channel(tmp_path) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ch.unary_unary("/nobody.Service/Nothing")(b"", timeout=5)
                assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
            assert frames.routed == {"runtime": 1, "internal": 1, "moved": 0}

    run(main())


def test_own_paths_by_handler_or_by_service_prefix() -> None:
    class One(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> Any:
            return object() if details.method == "/a.B/C" else None  # type: ignore[attr-defined]

    owns = own_paths((One(),))
    assert owns("/a.B/C") and not owns("/a.B/D") and not owns(VERSION)
    by_prefix = own_paths((One(),), ("a.B",))
    assert by_prefix("/a.B/D") and not by_prefix("/a.BC/D") and not by_prefix(VERSION)


async def _raw(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(path)


def test_a_connection_without_a_request_is_dismissed_with_goaway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cri_proxy.relay import fastpath

    monkeypatch.setattr(fastpath, "_FIRST_REQUEST_TIMEOUT", 0.3)

    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            reader, writer = await _raw(str(tmp_path / "proxy.sock"))
            writer.write(h2.PREFACE + h2.settings())
            got = await asyncio.wait_for(reader.read(), 5)  # until the proxy closes
            assert h2.read_head(got, 0)[1] == h2.SETTINGS
            length = h2.read_head(got, 0)[0]
            assert h2.read_head(got, 9 + length)[1] == h2.GOAWAY
            writer.close()
            # the connection never counted; the proxy still serves
            assert await n.introspect("Status")
            assert n.proxy.relay.frames is not None
            assert n.proxy.relay.frames.routed == {"runtime": 0, "internal": 1, "moved": 0}

    run(main())


def test_not_http2_goes_to_the_runtime_which_refuses_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            reader, writer = await _raw(str(tmp_path / "proxy.sock"))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.read(), 5)  # the runtime closes it
            writer.close()
            assert n.proxy.relay.frames is not None
            assert n.proxy.relay.frames.routed["runtime"] == 1

    run(main())


def test_runtime_unreachable_stand_in_still_answers_cri_while_introspection_works(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, relay_mode="frames") as n:
            await n.fake.stop(0)
            async with _channel(tmp_path) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _version(ch)(v1.VersionRequest(), timeout=5)
                assert err.value.code() is grpc.StatusCode.UNAVAILABLE
                assert "not reachable" in (err.value.details() or "")
            assert isinstance(await n.introspect("Cpusets"), list)

    run(main())


def test_ctl_cpusets_against_serve_in_frames_mode(tmp_path: Path) -> None:
    runtime, sock = tmp_path / "runtime.sock", tmp_path / "run" / "proxy.sock"
    fake = subprocess.Popen([CLI, "fake-runtime", "--listen", f"unix://{runtime}"])
    proxy = None
    try:
        wait_for_socket(runtime, fake)
        proxy = subprocess.Popen(
            [
                CLI,
                "serve",
                "--config",
                "/dev/null",
                "--listen",
                f"unix://{sock}",
                "--runtime-endpoint",
                f"unix://{runtime}",
                "--state-dir",
                str(tmp_path / "state"),
                "--kubelet-state-file",
                str(tmp_path / "cpu_manager_state"),
                "--relay-mode",
                "frames",
                "--dry-run",
            ]
        )
        wait_for_socket(sock, proxy)
        internal = sock.parent / ".proxy.sock.internal"
        assert internal.exists()
        env = {"CRI_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"}
        for args in (["cpusets", "-o", "json"], ["cpusets"], ["status"], ["plan"]):
            out = subprocess.run(
                [CLI, "ctl", "-r", f"unix://{sock}", *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )
            assert out.returncode == 0, out.stderr
            if "-o" in args:
                assert json.loads(out.stdout) == []
        proxy.terminate()
        assert proxy.wait(15) == 0
        assert not sock.exists() and not internal.exists()
    finally:
        for proc in (proxy, fake):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)
