"""Control: the control loop (``loop``) over the scheduler's pure policies, the deployment registry and
preloading (which zygotes each node keeps)."""
