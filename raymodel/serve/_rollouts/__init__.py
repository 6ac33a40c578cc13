"""Rollouts: a route's traffic moved to a candidate in guarded steps (``Rollout``, ``Guard``), driven by the
rollout controller's actor."""
