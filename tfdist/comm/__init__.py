"""Adapters over existing communication engines (TensorFlow collectives, Horovod), RPC, liveness."""
