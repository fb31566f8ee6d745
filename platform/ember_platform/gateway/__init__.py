"""The HTTP gateway: the ASGI app, its routes (one module per group), body limits and input validation."""
