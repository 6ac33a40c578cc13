"""The training server's pools: resident Ray Train worker groups that run jobs one after another
(``keeper.py``: the server's part that keeps them; ``pool.py``: a pool; ``session.py``: where a job on one runs)."""
