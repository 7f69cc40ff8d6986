"""``gpu-admission policies compile``: the policies' cluster-free parts as kube-apiserver's own CEL
policies (ValidatingAdmissionPolicy, MutatingAdmissionPolicy), which need no webhook hop.

Modules: :mod:`~webhook.cel.syntax` (CEL text), :mod:`~webhook.cel.podspecs`
(pod specs, containers, GPUs and classes in CEL), :mod:`~webhook.cel.scope`
(where a policy applies), :mod:`~webhook.cel.findings` (the compiled checks),
:mod:`~webhook.cel.patches` (the compiled mutations),
:mod:`~webhook.cel.validating` and :mod:`~webhook.cel.mutating` (the policy
documents), :mod:`~webhook.cel.reach` (the webhooks' reach, copied),
:mod:`~webhook.cel.output` (the files) and :mod:`~webhook.cel.command` (the
command). What compiles is decided by :mod:`webhook.policy.offload`, which
the server follows to skip it. A shell: it imports the policy core, never the
server or the audit, and no client.
"""
