"""What the node has: pods, containers, what was applied to each, and how that survives restarts.

Fed by CRI events (hooks), by recovery from the runtime, and by the checkpoint; read by the
policy to build the rules' inputs. No gRPC here.
"""
