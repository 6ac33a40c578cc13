"""The Ray instance raymodel works in: starting or joining it (``cluster``), the order its processes
start in (``ray_start``), how HTTP reaches its Serve routes (``ingress``), and the calls of a client
off the cluster, run by a driver on it (``remote``)."""
