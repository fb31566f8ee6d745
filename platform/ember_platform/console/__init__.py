"""The web console at ``/ui``: static files (HTML, JavaScript, CSS) served by the control plane, no build step."""
