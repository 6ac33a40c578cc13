"""A pip requirement the cluster lacks: the client makes a wheel of this folder and names it in
``rm.init(runtime_env={"pip": {...}})``; the cluster's processes install it from that wheel, offline.
On the client's own path it stands for a package installed in the laptop's environment."""

MARK = 7.0
OFFSET = 0.0
