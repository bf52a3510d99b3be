"""Running as a node daemon: systemd notify, metrics and health endpoints, the gRPC health service."""
