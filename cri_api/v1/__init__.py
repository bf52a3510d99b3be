"""CRI `runtime.v1` protobuf messages and gRPC stubs generated from api.proto."""
