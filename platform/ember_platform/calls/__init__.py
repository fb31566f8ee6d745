"""The call path: synchronous calls over NATS (``router``; the choice of a replica is the pure ``choice``) and
durable calls (``durable``: submit, records, dead letters)."""
