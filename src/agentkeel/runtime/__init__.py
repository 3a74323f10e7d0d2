"""The control plane: run records, stores, admission, workers, stream bridge, journal, checkpoints.

Knows nothing of HTTP.
"""
