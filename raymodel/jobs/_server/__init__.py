"""The training server: the detached actor (``actor.py``) and its parts (the queue and scheduling, changes
to running jobs, recovery after a restart), and the runner actor that runs each job."""
