"""The zygote process (``python -m ember_runtime.zygote``): imports an app and runs its snap setup once, then
forks replicas from that state on request."""
