"""The GPU quota ledger: charges kept in the API server, shared by every replica.

A shell beside the server: it writes GPUQuotaLedger objects through the
cluster package's session (``webhook.cluster``) and judges charges the policy
core states (``webhook.policy.charges``). Nothing below it imports it.

- ``charger``: one writer per ledger that judges and writes charges (``Ledger``);
- ``document``: the GPUQuotaLedger object, its parts and charge lines;
- ``store``: reads and conditional writes of ledgers;
- ``upkeep``: releases, the window's sweep, self-healing and the recount;
- ``recount``: what the stored pods hold, from the cluster index;
- ``reservation``: reservations of capacity ahead of a pod;
- ``serving``: whether the API server serves ledgers (readiness);
- ``settings`` and ``metrics``: the command-line settings and the metrics.
"""
