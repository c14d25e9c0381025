"""The API server's JSON as the informer decodes it: every field the translation can read, and
not the rest.

A pod's `metadata.managedFields` (the server-side apply bookkeeping of who set which field) is
about 40% of its JSON and most of its small objects (measured on a pod bound by a client and
run by KWOK: 1,266 of 3,044 bytes). Nothing in kai-es reads it, yet building it as dicts was
the largest single cost of the informer's watch (py-spy). msgspec decodes a `TypedDict` into a plain dict and skips,
without building them, the keys the TypedDict does not declare: so each document is decoded
against a shape that declares everything but those.

Contract:
- `watch_event(line)` and `list_document(body)` return what `msgspec.json.decode` returns for
  the same bytes (plain dicts and lists, integers of any size), except that an object's
  `metadata` keeps only the fields of Kubernetes' ObjectMeta without `managedFields`, and an
  object keeps only the top-level fields a kind kai-es translates has (`OBJECT_FIELDS`; a
  ConfigMap's `data` and `binaryData` are not kept: its translation reads its name alone).
  `kai_es.ingest.translate` reads nothing else (`tests/test_api_json.py` holds it to giving the
  same payload, or the same rejection, for any object decoded either way).
- A document that does not have that shape (a `metadata` that is not an object, `items` that
  is not a list, ...) is decoded whole, as before, so that the translation rejects it with the
  same reason; so is a watch event that is not an object's change or a bookmark (an `ERROR`
  event's `Status` keeps its `code` and `message`).
- Bytes that are not JSON raise `msgspec.DecodeError` (a `ValueError`), as `msgspec.json.decode`.
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

import msgspec


class _Metadata(TypedDict, total=False):
    """Kubernetes' ObjectMeta without `managedFields`."""

    name: Any
    generateName: Any
    namespace: Any
    selfLink: Any
    uid: Any
    resourceVersion: Any
    generation: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    deletionGracePeriodSeconds: Any
    labels: Any
    annotations: Any
    ownerReferences: Any
    finalizers: Any


class _Object(TypedDict, total=False):
    """The top-level fields of the kinds kai-es lists and watches (`source.ALL_KINDS`)."""

    apiVersion: Any
    kind: Any
    metadata: _Metadata
    spec: Any
    status: Any
    # PriorityClass
    value: Any
    globalDefault: Any
    preemptionPolicy: Any
    description: Any
    # ConfigMap (not its data)
    immutable: Any


class _WatchEvent(TypedDict, total=False):
    type: Any
    object: _Object


class _List(TypedDict, total=False):
    metadata: Any
    items: list[_Object] | None


#: the top-level fields an object keeps (`_Object`'s)
OBJECT_FIELDS: Final = frozenset(_Object.__annotations__)
#: the metadata fields an object keeps (`_Metadata`'s)
METADATA_FIELDS: Final = frozenset(_Metadata.__annotations__)
#: the watch event types whose object is decoded in the narrow shape
_OBJECT_EVENTS: Final = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})

_WHOLE: Final = msgspec.json.Decoder()
_EVENT: Final = msgspec.json.Decoder(_WatchEvent)
_LIST: Final = msgspec.json.Decoder(_List)


def watch_event(line: bytes) -> Any:
    """One line of a WATCH stream (see the module's contract)."""
    try:
        event = _EVENT.decode(line)
    except msgspec.ValidationError:
        return _WHOLE.decode(line)
    if event.get("type") not in _OBJECT_EVENTS:
        return _WHOLE.decode(line)
    return event


def list_document(body: bytes) -> Any:
    """A LIST answer (see the module's contract)."""
    try:
        return _LIST.decode(body)
    except msgspec.ValidationError:
        return _WHOLE.decode(body)
