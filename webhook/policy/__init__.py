"""The policy machinery: policy files in, a decision out, with no I/O.

The schema and its loader, matching, the rule context, the engine, the
decision and the rules (one module per family). Imports: the standard
library, pydantic, yaml, :mod:`webhook.errors`, :mod:`webhook.kube`,
:mod:`webhook.gpu` and :mod:`webhook.view`; the server and the audit CLI
import it, never the other way round.
"""
