"""A cluster on the simulator's one clock: replicas of a serving instance, each a whole scheduler
core with its own KV pool and prefix cache (cluster.py), behind a router (router.py) that sends
each request to one of them by a policy (routing.py), on what it knows of them (how stale its
view is, and how long a request takes to reach an instance)."""
