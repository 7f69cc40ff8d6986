"""The registry resolver: an image reference → its config, read over the OCI distribution API.

The only part of gpu-admission that talks to container registries, and the
only importer of an HTTP client for them. The pure core never waits on it:
rules read what the resolver already knows through the cluster view
(``ClusterView.image_config``); the server gives the resolver a small budget
per request and lets what it has not finished complete in the background.
"""
