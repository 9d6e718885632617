"""Knowledge Service server: async gRPC, lanes, stores, search, dispatch, document graph."""

__version__ = "0.1.0"
