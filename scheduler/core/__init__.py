"""Shared vocabulary of both schedulers: a request, its sampling, the plan of one forward, the protocol the loop asks of a scheduler, the end-of-run invariants."""
