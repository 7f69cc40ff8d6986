"""A fake Kubernetes API server that speaks the real REST protocol, for tests.

The real ``kubernetes`` client talks to it as to kube-apiserver: typed list
and watch calls, get/create/update/patch/delete, Status errors. It runs on
its own event loop in a thread of its own, so blocking clients in the test
thread and asyncio tests can both use it, and every control method
(``add``, ``compact``, ``drop_watches``, ``fail_next``, ``hold`` ...) is thread-safe.

What it reproduces, after the API conventions
(https://kubernetes.io/docs/reference/using-api/api-concepts/):

- one global, monotonically increasing ``resourceVersion`` (a string on the
  wire) stamped on every write, plus ``uid`` and ``creationTimestamp``;
- lists ``{"kind": "PodList", "apiVersion": "v1", "metadata":
  {"resourceVersion", "continue", "remainingItemCount"}, "items": [...]}``,
  items without ``kind``, ordered by key like etcd, paginated with
  ``limit``/``continue`` over a consistent snapshot;
- watches: chunked JSON lines ``{"type", "object"}`` from a resourceVersion
  on, synthetic ADDED events when it is unset or "0", ``timeoutSeconds``,
  BOOKMARK events (``allowWatchBookmarks``), ERROR events with a 410
  ``Expired`` Status once the history was compacted;
- lists of metadata alone (``PartialObjectMetadataList``) when the Accept
  header asks for them;
- Status objects for 404/409/410/422/500 as kube-apiserver writes them.

Simplifications: label selectors are equality based, strategic merge patch
merges lists of named objects by ``name`` and replaces other lists, a list
at an exact older ``resourceVersion`` is refused with 410.

Modules, from the outside in:

- :mod:`~tests.fakeapi.server`: :class:`FakeApiServer`, its lifecycle and
  the test controls;
- :mod:`~tests.fakeapi.handlers`: routing and the HTTP handlers;
- :mod:`~tests.fakeapi.store`: objects, resourceVersions, history, snapshots
  and open watches;
- :mod:`~tests.fakeapi.watch`: one open watch and the streaming of its events;
- :mod:`~tests.fakeapi.request_log`: the request log, injected failures and held requests;
- :mod:`~tests.fakeapi.selector`, :mod:`~tests.fakeapi.patch`,
  :mod:`~tests.fakeapi.query`: label/field selectors, PATCH bodies, numeric
  query parameters and continue tokens;
- :mod:`~tests.fakeapi.resources` and :mod:`~tests.fakeapi.status`: the
  resources served, and the ``Status`` objects of failures.
"""

from __future__ import annotations

from tests.fakeapi.request_log import RequestRecord, iter_requests
from tests.fakeapi.resources import DEFAULT_NAMESPACES, TYPES, Obj, ResourceType
from tests.fakeapi.server import FakeApiServer
from tests.fakeapi.status import ApiError, status_object
from tests.fakeapi.watch import INITIAL_EVENTS_END

__all__ = [
    "DEFAULT_NAMESPACES",
    "INITIAL_EVENTS_END",
    "TYPES",
    "ApiError",
    "FakeApiServer",
    "Obj",
    "RequestRecord",
    "ResourceType",
    "iter_requests",
    "status_object",
]
