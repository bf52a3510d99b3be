"""Inputs that change outside CRI: the kubelet's CPU manager state file (and later the API watch)."""
