"""One served model's replica: the Serve deployment of a model (``ModelReplica``), its adaptive batching,
and the keys that guard a route."""
