"""``gpu-admission test``: policy tests, as ``kyverno test`` and ``gator verify`` run them, on the audit's engine path.

A ``GPUAdmissionTest`` (docs/testing.md) names policies, manifests, cluster
facts and request facts, and the results expected per resource: the verdict
of the object or of one policy rule, a message pattern, the patched resource.

- :mod:`~webhook.audit.suite.schema`: the document; :mod:`~webhook.audit.suite.files`:
  finding and reading test files;
- :mod:`~webhook.audit.suite.testrun`: one test through :func:`webhook.audit.judge.judge`;
  :mod:`~webhook.audit.suite.observed`: a judged object as expectations read it;
- :mod:`~webhook.audit.suite.checks`: one expectation held against it;
  :mod:`~webhook.audit.suite.difference`: the semantic diff of patched resources;
- :mod:`~webhook.audit.suite.table`, :mod:`~webhook.audit.suite.junit`: the outputs;
  :mod:`~webhook.audit.suite.update`: ``--update``; :mod:`~webhook.audit.suite.command`: options and exit codes.
"""

from __future__ import annotations

from webhook.audit.suite.command import add_parser

__all__ = ["add_parser"]
