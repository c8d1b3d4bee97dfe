"""Adapters over existing communication engines (TensorFlow collectives; Horovod later)."""
