"""The micro-batcher and its pure parts: dispatch policy, cost model, failure isolation, batch statistics.

It knows nothing of NATS, the agent or the replica process: it takes ``Call``s and runs batches."""
