"""gRPC transport: servicers, interceptors, server factory."""
