"""The transparent CRI relay: a `grpc.aio` server that forwards every call as raw bytes.

Hooks (method name -> pre/post) decode only the calls they need; everything else passes through
untouched, including methods this build has never heard of.
"""
