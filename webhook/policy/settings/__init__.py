"""The policy settings of each rule, as pydantic models: what a policy file may say, validated on load.

``base`` holds the building blocks (selectors, quantities, resource names);
``mutation``, ``validation`` and ``dra`` the settings of each rule family.
Imports: pydantic, :mod:`webhook.kube` and :mod:`webhook.gpu`.
"""
