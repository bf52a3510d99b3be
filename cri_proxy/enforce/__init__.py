"""Enforcement: the CRI hooks, the reconciler, recovery, and the introspection service."""
