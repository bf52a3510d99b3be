"""Every `ctl` subcommand's flags, with crictl's names; handlers are named "module:function" and
imported only when their command runs, so `cri-proxy --help` and the other commands stay light."""

from __future__ import annotations

import argparse
from typing import Any

from cri_proxy.ctl.flags import add_label, add_output, command
from cri_proxy.ctl.options import parse_duration

VERSIONS = ("v1", "v1alpha2")


def register(cmds: Any) -> None:
    _runtime(cmds)
    _pods(cmds)
    _containers(cmds)
    _streams(cmds)
    _logs(cmds)
    _images(cmds)
    _client(cmds)
    _call(cmds)
    _proxy(cmds)


def _runtime(cmds: Any) -> None:
    command(cmds, "version", "runtime:version", "Display runtime version information")
    p = command(cmds, "info", "runtime:info", "Display information of the container runtime")
    add_output(p, "json", ("json", "yaml", "go-template"))
    p.add_argument("-q", "--quiet", action="store_true", help="do not show verbose information")
    command(cmds, "runtime-config", "runtime:runtime_config", "Retrieve the container runtime configuration")
    p = command(
        cmds, "update-runtime-config", "runtime:update_runtime_config", "Update the runtime configuration"
    )
    p.add_argument("-p", "--pod-cidr", help="the new CIDR for pod IP addresses")
    p = command(cmds, "metricdescs", "runtime:metricdescs", "List metric descriptors")
    add_output(p, "json", ("json", "yaml"))
    p = command(cmds, "metricsp", "runtime:metricsp", "List pod metrics")
    add_output(p, "json", ("json", "yaml"))
    p.add_argument("-w", "--watch", action="store_true", help="watch pod metrics")
    p = command(cmds, "events", "runtime:events", "Stream the events of containers", aliases=["event"])
    add_output(p, "json", ("json", "yaml", "go-template"))


def _list_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="filter by pod name regular expression pattern")
    p.add_argument("--namespace", help="filter by pod namespace regular expression pattern")
    p.add_argument("-s", "--state", help="filter by pod state (ready, notready)")
    add_label(p)
    p.add_argument("-l", "--latest", action="store_true", help="show the most recently created pod")
    p.add_argument("-n", "--last", type=int, default=0, help="show last n recently created pods")


def _pods(cmds: Any) -> None:
    p = command(cmds, "pods", "pods:pods", "List pods")
    p.add_argument("--id", default="", help="filter by pod id (prefix)")
    _list_flags(p)
    p.add_argument("-v", "--verbose", action="store_true", help="show verbose info for pods")
    p.add_argument("-q", "--quiet", action="store_true", help="list only pod IDs")
    p.add_argument("--no-trunc", action="store_true", help="show output without truncating the ID")
    add_output(p, "table", ("json", "yaml", "table"))

    p = command(cmds, "inspectp", "pods:inspectp", "Display the status of one or more pods")
    p.add_argument("ids", nargs="*", metavar="POD-ID")
    _list_flags(p)
    add_output(p, "json", ("json", "yaml", "go-template", "table"))
    p.add_argument("-q", "--quiet", action="store_true", help="do not show verbose information")

    p = command(cmds, "runp", "pods:runp", "Run a new pod")
    p.add_argument("pod_config", metavar="pod-config.[json|yaml]")
    p.add_argument("-r", "--runtime", default="", help="runtime handler to use")
    p.add_argument("-T", "--cancel-timeout", type=parse_duration, help="timeout of the request")

    p = command(cmds, "stopp", "pods:stopp", "Stop one or more running pods")
    p.add_argument("ids", nargs="+", metavar="POD-ID")

    p = command(cmds, "rmp", "pods:rmp", "Remove one or more pods")
    p.add_argument("ids", nargs="*", metavar="POD-ID")
    p.add_argument(
        "-f", "--force", action="store_true", help="force removal of the pod, disregarding if running"
    )
    p.add_argument("-a", "--all", action="store_true", help="remove all pods")

    p = command(cmds, "statsp", "pods:statsp", "List pod statistics")
    p.add_argument("id", nargs="?", default="", metavar="ID")
    p.add_argument("--id", dest="id_flag", default="", help="filter by pod id (prefix)")
    add_label(p)
    add_output(p, "table", ("json", "yaml", "table"))
    p.add_argument("-s", "--seconds", type=int, default=1, help="sample duration for CPU usage in seconds")
    p.add_argument("-w", "--watch", action="store_true", help="watch pod resources")


def _filter_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="filter by container name regular expression pattern")
    p.add_argument("--namespace", help="filter by pod namespace regular expression pattern")
    p.add_argument("-p", "--pod", default="", help="filter by pod id (prefix)")
    p.add_argument("--image", default="", help="filter by container image")
    p.add_argument("-s", "--state", help="filter by container state (created, running, exited, unknown)")
    add_label(p)
    p.add_argument("-a", "--all", action="store_true", help="show all containers")
    p.add_argument(
        "-l", "--latest", action="store_true", help="the most recently created container (any state)"
    )
    p.add_argument("-n", "--last", type=int, default=0, help="last n recently created containers (any state)")


def _containers(cmds: Any) -> None:
    p = command(cmds, "ps", "containers:ps", "List containers")
    p.add_argument("--id", default="", help="filter by container id (prefix)")
    _filter_flags(p)
    p.add_argument("-v", "--verbose", action="store_true", help="show verbose information for containers")
    p.add_argument("-q", "--quiet", action="store_true", help="only display container IDs")
    p.add_argument("--no-trunc", action="store_true", help="show output without truncating the ID")
    p.add_argument(
        "-r", "--resolve-image-path", action="store_true", help="show image path instead of image id"
    )
    add_output(p, "table", ("json", "yaml", "table"))

    p = command(cmds, "inspect", "containers:inspect", "Display the status of one or more containers")
    p.add_argument("ids", nargs="*", metavar="CONTAINER-ID")
    _filter_flags(p)
    add_output(p, "json", ("json", "yaml", "go-template", "table"))
    p.add_argument("-q", "--quiet", action="store_true", help="do not show verbose information")

    p = command(cmds, "create", "containers:create", "Create a new container")
    p.add_argument("pod", metavar="POD")
    p.add_argument("container_config", metavar="container-config.[json|yaml]")
    p.add_argument("pod_config", metavar="pod-config.[json|yaml]")
    p.add_argument(
        "--no-pull", action="store_true", help="do not pull the image (overrides pull-image-on-create)"
    )
    p.add_argument("--with-pull", action="store_true", help="pull the image before creating the container")
    p.add_argument("-T", "--cancel-timeout", type=parse_duration, help="timeout of the request")

    p = command(cmds, "start", "containers:start", "Start one or more created containers")
    p.add_argument("ids", nargs="+", metavar="CONTAINER-ID")

    p = command(cmds, "stop", "containers:stop", "Stop one or more running containers")
    p.add_argument("ids", nargs="*", metavar="CONTAINER-ID")
    p.add_argument(
        "-t",
        "--timeout",
        dest="stop_timeout",
        type=int,
        default=0,
        help="seconds to wait before killing the container",
    )
    p.add_argument("-a", "--all", action="store_true", help="stop all running containers")

    p = command(cmds, "rm", "containers:rm", "Remove one or more containers")
    p.add_argument("ids", nargs="*", metavar="CONTAINER-ID")
    p.add_argument(
        "-f", "--force", action="store_true", help="force removal of the container, disregarding if running"
    )
    p.add_argument(
        "-k", "--keep-logs", action="store_true", help="preserve the container log file and its rotations"
    )
    p.add_argument("-a", "--all", action="store_true", help="remove all containers")

    p = command(cmds, "update", "containers:update", "Update one or more running containers")
    p.add_argument("ids", nargs="+", metavar="CONTAINER-ID")
    p.add_argument("--cpu-count", type=int, default=0, help="(Windows only) number of CPUs")
    p.add_argument("--cpu-maximum", type=int, default=0, help="(Windows only) CPU cycles, percent * 100")
    p.add_argument("--cpu-period", type=int, default=0, help="CPU CFS period (usecs)")
    p.add_argument("--cpu-quota", type=int, default=0, help="CPU CFS hardcap limit (usecs)")
    p.add_argument("--cpu-share", type=int, default=0, help="CPU shares (relative weight)")
    p.add_argument("--cpuset-cpus", default="", help="CPU(s) to use")
    p.add_argument("--cpuset-mems", default="", help="memory node(s) to use")
    p.add_argument("--memory", type=int, default=0, help="memory limit (in bytes)")
    p.add_argument("--oom-score-adj", type=int, default=0, help="OOM killer score adjustment")
    p.add_argument(
        "--force",
        action="store_true",
        help="cri-proxy: pin --cpuset-cpus on a container whose cpuset the proxy manages "
        "(kept across proxy restarts, until the container is removed or --unpin)",
    )
    p.add_argument(
        "--unpin",
        action="store_true",
        help="cri-proxy: remove the pin --force set; the proxy applies the rules' cpuset again",
    )

    p = command(
        cmds,
        "exec",
        "containers:exec_",
        "Run a command in a running container",
        epilog="The CONTAINER-ID is only required if none of the filter flags is given: "
        "--image, --label, --last, --latest, --name, --pod, --state. Without -s the session runs on the "
        "runtime's streaming server, over websocket (v4.channel.k8s.io).",
    )
    p.add_argument("-s", "--sync", action="store_true", help="run the command synchronously (ExecSync)")
    p.add_argument(
        "--timeout", dest="exec_timeout", type=int, default=0, help="timeout in seconds (default 0: none)"
    )
    p.add_argument("-i", "--interactive", action="store_true", help="keep stdin open")
    p.add_argument("-t", "--tty", action="store_true", help="allocate a pseudo-TTY")
    p.add_argument("-e", "--ignore-errors", action="store_true", help="ignore errors of the command")
    p.add_argument("--image", default="", help="exec in every container of this image")
    add_label(p)
    p.add_argument("-n", "--last", type=int, default=0, help="exec in the last n containers (0: all)")
    p.add_argument("-l", "--latest", action="store_true", help="exec in the most recently created container")
    p.add_argument("--name", default="", help="exec in every container whose name matches this pattern")
    p.add_argument("-x", "--parallel", action="store_true", help="run in every selected container at once")
    p.add_argument("-p", "--pod", default="", help="exec in every container of this pod id")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the container id first")
    p.add_argument("--state", default="", help="exec in every container in this state")
    _streaming_flags(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[CONTAINER-ID] COMMAND [ARG...]")

    p = command(cmds, "stats", "containers:stats", "List container(s) resource usage statistics")
    p.add_argument("id", nargs="?", default="", metavar="ID")
    p.add_argument("--id", dest="id_flag", default="", help="filter by container id (prefix)")
    p.add_argument("-p", "--pod", default="", help="filter by pod id (prefix)")
    p.add_argument(
        "-a", "--all", action="store_true", help="show all containers (default shows just running)"
    )
    add_label(p)
    add_output(p, "table", ("json", "yaml", "table"))
    p.add_argument("-s", "--seconds", type=int, default=1, help="sample duration for CPU usage in seconds")
    p.add_argument("-w", "--watch", action="store_true", help="watch container resources")


def _streaming_flags(p: Any) -> None:
    """crictl's flags for the runtime's streaming server (ctl speaks websocket whatever --transport says)."""
    p.add_argument("--tls-ca", default="", help="the streaming server's CA certificate")
    p.add_argument("--tls-cert", default="", help="the streaming TLS client certificate")
    p.add_argument("--tls-key", default="", help="the streaming TLS client key")
    p.add_argument(
        "--tls-sni", "--tls-server-name", default="localhost", help="server name checked in its certificate"
    )
    p.add_argument(
        "-r",
        "--transport",
        choices=("spdy", "websocket"),
        default="spdy",
        help="accepted as crictl's; ctl always speaks websocket",
    )


def _streams(cmds: Any) -> None:
    p = command(cmds, "attach", "containers:attach", "Attach to a running container")
    p.add_argument("-i", "--stdin", action="store_true", help="keep stdin open")
    p.add_argument("-t", "--tty", action="store_true", help="allocate a pseudo-TTY")
    _streaming_flags(p)
    p.add_argument("container", nargs="?", default="", metavar="CONTAINER-ID")

    p = command(cmds, "port-forward", "portforward:port_forward", "Forward local port to a pod")
    _streaming_flags(p)
    p.add_argument("pod", nargs="?", default="", metavar="POD-ID")
    p.add_argument("ports", nargs="*", metavar="[LOCAL_PORT:]REMOTE_PORT")

    p = command(cmds, "checkpoint", "containers:checkpoint", "Checkpoint one or more running containers")
    p.add_argument("ids", nargs="*", metavar="CONTAINER-ID")
    p.add_argument("-e", "--export", default="", help="the tar archive to export the checkpoint to")

    p = command(cmds, "run", "containers:run", "Run a new container inside a sandbox")
    p.add_argument("container_config", nargs="?", metavar="container-config.[json|yaml]")
    p.add_argument("pod_config", nargs="?", metavar="pod-config.[json|yaml]")
    p.add_argument("-r", "--runtime", default="", help="runtime handler to use")
    p.add_argument("-T", "--cancel-timeout", type=parse_duration, help="timeout of the create request")
    p.add_argument("--no-pull", action="store_true", help="do not pull the image")
    p.add_argument("--with-pull", action="store_true", help="pull the image first")
    p.add_argument("--pull-timeout", "--pt", type=parse_duration, help="the longest a pull may take")
    p.add_argument(
        "--auth", default="", metavar="AUTH_STRING", help="base64 USERNAME[:PASSWORD] for the registry"
    )
    p.add_argument("--creds", default="", metavar="USERNAME[:PASSWORD]", help="credentials for the registry")
    p.add_argument("--username", default="", help="registry user name")


def _client(cmds: Any) -> None:
    p = command(cmds, "config", "client:config", "Get, set and list crictl configuration options")
    p.set_defaults(ctl_offline=True)
    p.add_argument("--get", default="", metavar="KEY", help="show the option's value")
    p.add_argument("--list", action="store_true", help="show every option's value")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set options")
    p.add_argument("words", nargs="*", metavar="KEY [VALUE]")

    p = command(cmds, "completion", "client:completion", "Output shell completion code")
    p.set_defaults(ctl_offline=True)
    p.add_argument("shell", nargs="?", default="bash", metavar="SHELL", help="bash, zsh or fish")


def _logs(cmds: Any) -> None:
    p = command(cmds, "logs", "logs:logs", "Fetch the logs of a container")
    p.add_argument("container", metavar="CONTAINER-ID")
    p.add_argument("-f", "--follow", action="store_true", help="follow log output")
    p.add_argument("-p", "--previous", action="store_true", help="the logs of the previous instance")
    p.add_argument("--tail", type=int, default=-1, help="number of lines to show from the end (default all)")
    p.add_argument("--limit-bytes", type=int, default=-1, help="maximum bytes of logs to return")
    p.add_argument(
        "--since", default="", help="show logs since a time (2013-01-02T13:23:37Z) or for a duration (42m)"
    )
    p.add_argument("-t", "--timestamps", action="store_true", help="show timestamps")
    p.add_argument("-r", "--reopen", action="store_true", help="reopen the container's log file first")
    p.add_argument("-s", "--stream", choices=("stdout", "stderr"), help="show one stream only (default both)")


def _images(cmds: Any) -> None:
    p = command(cmds, "images", "images:images", "List images", aliases=["image", "img"])
    p.add_argument("name", nargs="?", default="", metavar="REPOSITORY[:TAG]")
    p.add_argument("-q", "--quiet", action="store_true", help="only show image IDs")
    p.add_argument("-v", "--verbose", action="store_true", help="show verbose info for images")
    p.add_argument("--digests", action="store_true", help="show digests")
    p.add_argument("--no-trunc", action="store_true", help="show output without truncating the ID")
    p.add_argument("--pinned", action="store_true", help="show whether the image is pinned or not")
    add_output(p, "table", ("json", "yaml", "table"))

    p = command(cmds, "inspecti", "images:inspecti", "Return the status of one or more images")
    p.add_argument("ids", nargs="*", metavar="IMAGE-ID")
    p.add_argument("--name", default="", help="filter by image name")
    add_output(p, "json", ("json", "yaml", "go-template", "table"))
    p.add_argument("-q", "--quiet", action="store_true", help="do not show verbose information")

    p = command(cmds, "pull", "images:pull", "Pull an image from a registry")
    p.add_argument("image", metavar="NAME[:TAG|@DIGEST]")
    p.add_argument("--pod-config", help="pod-config.[json|yaml] to pull the image for")

    p = command(cmds, "rmi", "images:rmi", "Remove one or more images")
    p.add_argument("ids", nargs="*", metavar="IMAGE-ID")
    p.add_argument("-a", "--all", action="store_true", help="remove all images")
    p.add_argument("-q", "--prune", action="store_true", help="remove all unused images")

    p = command(cmds, "imagefsinfo", "images:imagefsinfo", "Return image filesystem info")
    add_output(p, "json", ("json", "yaml", "go-template", "table"))


def _call(cmds: Any) -> None:
    p = command(
        cmds,
        "call",
        "call:call",
        "Send any CRI request given as JSON and print the JSON response",
        epilog="e.g. `call RuntimeService/Version '{}'`, `call runtime.v1.ImageService/ListImages`, "
        "`call ContainerStatus '{\"containerId\": \"abc...\"}'`; JSON '-' reads stdin, '@FILE' a file.",
    )
    p.add_argument("method", nargs="?", metavar="SERVICE/METHOD")
    p.add_argument("request", nargs="?", default="{}", metavar="JSON")
    p.add_argument("--api", choices=VERSIONS, help="CRI API version (default v1, or the one the name gives)")
    p.add_argument("-l", "--list", action="store_true", help="list the methods of both services and exit")
    p.add_argument("--emit-defaults", action="store_true", help="print fields that have their default value")
    p.add_argument("--count", type=int, default=0, help="streaming methods: stop after this many messages")


def _proxy(cmds: Any) -> None:
    p = command(
        cmds, "cpusets", "proxy:cpusets", "every container: pod, QoS, decided and applied cpuset, why"
    )
    add_output(p, "table", ("table", "json", "yaml"))
    command(cmds, "snapshot", "proxy:snapshot", "the live node snapshot, in `cri-proxy plan` input format")
    command(cmds, "plan", "proxy:plan", "the live decisions, in `cri-proxy plan` output format")
    p = command(
        cmds, "status", "proxy:status", "pods and containers tracked, marks, dry-run, reconcile counters"
    )
    add_output(p, "table", ("table", "json", "yaml"))
    p = command(cmds, "pools", "proxy:pools", "the shared CPU pools of the live plan (LS and BE)")
    add_output(p, "table", ("table", "json", "yaml"))
    p = command(cmds, "problems", "proxy:problems", "what the live plan could not honour, pod by pod")
    add_output(p, "table", ("table", "json", "yaml"))
    p = command(cmds, "cpus", "cpus:cpus", "one row per CPU: pools, holder, containers on it, conflicts")
    add_output(p, "table", ("table", "json", "yaml"))
