"""Quotas: limits per app pattern (replicas, GPU memory, concurrent calls, request rate) or per token (concurrent
calls, request rate), kept in the ``ember_quotas`` bucket and mirrored in memory by every control plane.

``rules`` checks a quota request and matches quotas to apps and tokens; ``limiter`` admits calls (token buckets,
calls in flight) with an injected clock; ``caps`` bounds the replicas the control loop may want and measures what a
quota's apps hold: all three pure. ``store`` does the I/O (the bucket, its mirror).
"""
