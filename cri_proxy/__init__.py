"""cri-proxy: a CRI gRPC interposing proxy that places containers on CPUs by Koordinator's QoS rules."""

__version__ = "0.1.0"
