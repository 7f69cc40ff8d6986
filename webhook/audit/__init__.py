"""``gpu-admission audit``: the server's policies and engine over manifests or a cluster, offline.

Modules, from the inputs to the report:

- :mod:`~webhook.audit.inputs`: manifest files, folders and stdin → objects
  with file, document index and line (or a problem for a broken document);
- :mod:`~webhook.audit.snapshot`: ``--cluster-state`` dumps → the cluster view;
- :mod:`~webhook.audit.cluster_source`: ``--cluster``: the live cluster as
  the view, and its running workloads as objects to audit;
- :mod:`~webhook.audit.judge`: one object through the engine, mutate then
  validate, as kube-apiserver calls the two webhooks;
- :mod:`~webhook.audit.report`: the output formats (text, json,
  policyreport, junit, sarif); :mod:`~webhook.audit.mutated`: ``--diff`` and
  ``--write-mutated``; :mod:`~webhook.audit.progress`: the progress line;
- :mod:`~webhook.audit.command`: the options and the run, with its exit codes.
"""

from __future__ import annotations

from webhook.audit.command import add_parser, audit, run

__all__ = ["add_parser", "audit", "run"]
