"""GPU knowledge: data and tables with their sources, and the functions that read them.

GPU resource names and what a pod spec asks of them, MIG profiles, GPU
products, the CUDA→driver table and forward compatibility, image→CUDA,
NVIDIA's DRA device classes. Imports: the standard library and
:mod:`webhook.kube`.
"""
