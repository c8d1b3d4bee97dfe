"""Keras 3 callbacks for distributed and large-batch training."""
