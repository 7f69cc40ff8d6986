"""PATCH bodies: JSON patch, JSON merge patch, strategic merge patch and server-side apply.

The strategic merge patch is simplified: lists whose items all have a
``name`` merge item by item on it (``$patch: delete`` removes one), any
other list is replaced, as in a JSON merge patch. Server-side apply is
simplified too: the applied object creates one that is absent (in the
handler) and is merged into one that exists as a JSON merge patch (lists
replaced, as for the atomic lists of the report CRDs); fields a manager
stops applying are not removed, and field ownership is not kept.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from tests.fakeapi.resources import Obj
from tests.fakeapi.status import ApiError

APPLY = "application/apply-patch+yaml"


def apply_patch(current: Obj, patch: Any, content_type: str) -> Obj:
    """``current`` with ``patch`` applied as its content type says; 415 for other types."""
    if content_type == "application/json-patch+json":
        try:
            return jsonpatch.apply_patch(current, patch)  # type: ignore[no-any-return]
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(422, f"the server rejected our request due to an error in our "
                                f"request: {exc}", "Invalid") from exc  # fmt: skip
    if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json", APPLY):
        if not isinstance(patch, dict):
            raise ApiError(400, "a merge patch must be a JSON object")
        return merge(copy.deepcopy(current), patch, "strategic" in content_type)  # type: ignore[no-any-return]
    raise ApiError(415, "the body of the request was in an unknown format - accepted media "
                        "types include: application/json-patch+json, application/merge-patch"
                        "+json, application/strategic-merge-patch+json")  # fmt: skip


def merge(target: Any, patch: Any, strategic: bool) -> Any:
    """RFC 7386 merge patch; with ``strategic``, named list items merge by name."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and _named_list(value) and _named_list(result.get(key)):
            result[key] = _merge_named(result[key], value)
        else:
            result[key] = merge(result.get(key), value, strategic)
    return result


def _named_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value)


def _merge_named(current: list[Obj], patch: list[Obj]) -> list[Obj]:
    merged = {item["name"]: item for item in current}
    for item in patch:
        if item.get("$patch") == "delete":
            merged.pop(item["name"], None)
        else:
            merged[item["name"]] = merge(merged.get(item["name"]), item, True)
    return list(merged.values())
