"""Our wire-compatible CRI API (`runtime.v1` and its `runtime.v1alpha2` twin) and generated stubs."""
