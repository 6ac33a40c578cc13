"""Names every part of the training server agrees on: the server actor's, and the job states."""

#: The detached server actor's name and Ray namespace (one server per cluster).
NAME, NAMESPACE = "raymodel-job-server", "raymodel"
#: A job that is not done, and the states a job ends in.
ACTIVE, DONE = ("PENDING", "RUNNING"), ("SUCCEEDED", "FAILED", "STOPPED")
