"""NATS credentials and permissions: the control plane is nats-server's auth callout.

``keys`` makes and reads the key material and the server's ``authorization`` block, ``permissions`` says what
each kind of component may publish and subscribe to, ``callout`` answers the server's questions, and ``jwt``
speaks the server's JWTs. ``python -m ember_platform.natsauth`` sets up a new deployment.
"""
