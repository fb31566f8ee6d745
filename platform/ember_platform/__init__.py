"""Ember's control plane (``python -m ember_platform``): the HTTP gateway, the call path, control and the
scheduler. See docs/reference/code-layout.md; the ASGI app is ``gateway.asgi.create_app``.

Empty on purpose: importing one room (the scheduler's pure policies, say) loads nothing of the others.
"""
