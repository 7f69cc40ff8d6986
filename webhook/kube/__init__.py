"""Kubernetes semantics in plain Python: facts about the API that any Kubernetes tool would need.

Quantities, JSON pointers and the JSON Patch builder admission answers are
made with, node affinity, where each workload kind keeps its pod templates,
ResourceQuota, DRA claims and ResourceSlices. Nothing here knows about GPUs.
Imports: the standard library only (and its own modules).
"""
