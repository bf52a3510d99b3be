"""A small in-memory CRI runtime for fast tests, benchmarks and the demo when no containerd is there.

It keeps pods and containers, applies and records `UpdateContainerResources`, answers status
calls with the resources it holds, and streams container events. No processes are started.
"""
