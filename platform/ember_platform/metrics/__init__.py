"""What the control plane counts and how ``GET /metrics`` shows it (``prometheus_client``).

Two sources: ``calls.CallMetrics`` counts on the call path (a counter and a latency histogram per app, function,
version and status code), and ``state.StateCollector`` reads what the control plane already holds (replicas'
reports, the autoscaler's targets, the nodes' GPUs) at scrape time. ``scrape.render`` puts both together for one
token, showing only the apps it sees.
"""
