"""Who may do what over HTTP: bearer tokens (``tokens``: issued, kept as hashes in ``ember_tokens``, mirrored in
memory, checked on every request), what their scopes allow and which apps they see (``scopes``, pure), and the
control plane's first admin token (``bootstrap``)."""
