"""Secrets: named sets of environment variables, encrypted at rest (Fernet) under the control plane's key in the
``ember_secrets`` bucket, and delivered to node agents at a replica's start (``server``)."""
