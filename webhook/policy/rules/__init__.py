"""The rule families, one module each: ``PHASES`` and ``run(ctx, cfg)``, in the order of ``engine.RULES``.

A rule reads the pod spec through its :class:`~webhook.policy.context.RuleContext`,
writes only through the context's patch builder, and asks the cluster through
the view. Imports: the rest of :mod:`webhook.policy` and the layers below it.
"""
