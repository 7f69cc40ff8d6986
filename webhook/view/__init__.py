"""The cluster view: what the engine may know of the cluster, and the aggregates that answer it fast.

The ``ClusterView`` protocol, the snapshot view built from objects (audit,
tests), and what both it and the live index (:mod:`webhook.cluster`) share:
node groups, GPU usage per scope, the node filter, published devices and the
GPUs of a pod's DRA claims. Imports: the standard library, :mod:`webhook.kube`
and :mod:`webhook.gpu`; never the kubernetes client.
"""
