"""``gpu-admission serve``: the TLS admission server around the policy core.

The listener, the handlers (read → decode → evaluate → encode), limits,
metrics, certificate and policy reloads. Imports the policy core, the
cluster index, the registry resolver and the wire format; nothing imports it
but the command line.
"""
