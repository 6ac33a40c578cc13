"""A user's own package, importable only in the off-cluster client's process (tests/off_cluster.py)."""
