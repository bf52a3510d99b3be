"""Subcommands of the `cri-proxy` console script; each module has `register(subparsers)`."""
