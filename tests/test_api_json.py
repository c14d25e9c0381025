"""The informer's decoding of the API server's JSON (kai_es/adapters/kubernetes/api_json.py)
leaves out what nothing reads (`metadata.managedFields`, a ConfigMap's data) and changes no
translation: any object, well formed or hostile, decoded narrowly or whole, translates to the
same payload or is refused with the same reason."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from kai_es.adapters.kubernetes import api_json
from kai_es.ingest import translate as tr
from kai_es.ingest.pod_memo import PodMemo
from tests.builders import MakeNode, MakePod
from tests.test_adversarial_objects import (
    WEIRD_SCALARS,
    node,
    pod,
    podgroup,
    priority_class,
    queue,
    topology,
)

Obj = dict[str, Any]

#: a pod's managedFields as a real API server writes them (a client's create, KWOK's status)
MANAGED = [
    {"manager": "python", "operation": "Update", "apiVersion": "v1", "time": "2026-12-07T21:50:00Z",
     "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                                            "f:spec": {"f:containers": {'k:{"name":"main"}': {
                                                ".": {}, "f:image": {}, "f:name": {}}}}}},
    {"manager": "kwok", "operation": "Update", "apiVersion": "v1", "time": "2026-12-07T21:50:01Z",
     "fieldsType": "FieldsV1", "subresource": "status",
     "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}},
                               "f:phase": {}, "f:startTime": {}}}},
]


def _outcome(fn: Any, obj: Obj) -> object:
    try:
        return ("ok", fn(obj))
    except tr.IngestError as exc:
        return ("refused", exc.path, exc.message)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # as the informer's own catch sees them
        return ("error", type(exc).__name__, str(exc))


def _line(obj: Any, etype: str = "MODIFIED") -> bytes:
    return msgspec.json.encode({"type": etype, "object": obj})


def _dressed(draw: Any, obj: Obj) -> Any:
    """`obj` with what a cluster adds or breaks: managedFields, metadata the translation does
    not read, unknown top-level fields, or a metadata that is not an object at all."""
    obj = dict(obj)
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta = dict(meta)
        if draw(st.booleans()):
            meta["managedFields"] = draw(st.one_of(st.just(MANAGED), WEIRD_SCALARS))
        extra = draw(st.dictionaries(st.sampled_from(
            ["resourceVersion", "generation", "uid", "finalizers", "selfLink", "futureField", "managedFields"]),
            WEIRD_SCALARS, max_size=3))
        meta.update(extra)
        obj["metadata"] = meta
    obj.update(draw(st.dictionaries(st.sampled_from(["data", "binaryData", "immutable", "futureTopLevel", "status"]),
                                    WEIRD_SCALARS, max_size=2)))
    if draw(st.integers(0, 9)) == 0:
        obj["metadata"] = draw(WEIRD_SCALARS)
    return obj


@st.composite
def cluster_object(draw: Any) -> Any:
    base = draw(st.one_of(node(), queue(), pod(), podgroup(), priority_class(), topology(),
                          st.builds(lambda name: {"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": name, "namespace": "default"}},
                                    st.text(max_size=5))))
    return _dressed(draw, base)


@given(cluster_object(), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_any_object_translates_the_same_decoded_narrowly_or_whole(obj: Any, etype: str) -> None:
    line = _line(obj, etype)
    whole = msgspec.json.decode(line)
    narrow = api_json.watch_event(line)
    note(f"whole: {whole!r}\nnarrow: {narrow!r}")
    assert narrow["type"] == etype
    for fn in (tr.translate, PodMemo().translate):
        assert _outcome(fn, narrow["object"]) == _outcome(fn, whole["object"])
    # and a LIST answer's items, as the source reads them
    body = msgspec.json.encode({"kind": "List", "metadata": {"resourceVersion": "7"}, "items": [obj, obj]})
    items = api_json.list_document(body)["items"]
    assert [_outcome(tr.translate, o) for o in items] == [_outcome(tr.translate, whole["object"])] * 2


def test_a_pods_life_translates_the_same_through_the_memo() -> None:
    """A pod's watch events, bound and started, each with the managedFields a server writes:
    the memo's answers are the whole decoding's, and it reuses them as before."""
    base = MakePod("p").gpu(1).req(cpu="2").obj()
    memo_narrow, memo_whole = PodMemo(), PodMemo()
    for rv, change in enumerate([{}, {"spec": {**base["spec"], "nodeName": "n1"}},
                                 {"status": {"phase": "Running", "startTime": "2026-12-07T21:50:01Z"}}]):
        obj = {**base, **change, "metadata": {**base["metadata"], "resourceVersion": str(rv),
                                             "managedFields": MANAGED[:rv + 1]}}
        line = _line(obj)
        assert memo_narrow.translate(api_json.watch_event(line)["object"]) == \
            memo_whole.translate(msgspec.json.decode(line)["object"])
    assert memo_narrow.hits == memo_whole.hits == 2


def test_what_nothing_reads_is_not_decoded() -> None:
    pod_obj = MakePod("p").gpu(1).obj()
    pod_obj["metadata"].update(managedFields=MANAGED, resourceVersion="12", uid="u-1",
                               ownerReferences=[{"kind": "Job", "name": "j", "uid": "u-0"}])
    event = api_json.watch_event(_line(pod_obj))
    meta = event["object"]["metadata"]
    assert "managedFields" not in meta
    assert meta["resourceVersion"] == "12" and meta["ownerReferences"][0]["name"] == "j"
    assert event["object"]["spec"] == pod_obj["spec"]
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"},
                  "data": {"big": "x" * 1000}, "binaryData": {"b": "AAAA"}, "immutable": True}
    listed = api_json.list_document(msgspec.json.encode({"metadata": {"continue": "t"}, "items": [config_map]}))
    assert listed == {"metadata": {"continue": "t"},
                      "items": [{"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
                                 "metadata": {"name": "c", "namespace": "ns"}}]}
    node_obj = MakeNode("n1").obj()
    node_obj["metadata"]["managedFields"] = MANAGED
    assert "managedFields" not in api_json.watch_event(_line(node_obj, "ADDED"))["object"]["metadata"]


def test_kept_fields_are_those_the_translation_reads() -> None:
    """Every ObjectMeta field but managedFields, and the top-level fields of the kinds kai-es
    translates (a PriorityClass's value and policy among them)."""
    assert api_json.METADATA_FIELDS >= {"name", "namespace", "uid", "resourceVersion", "labels", "annotations",
                                        "ownerReferences", "creationTimestamp", "deletionTimestamp", "generation"}
    assert "managedFields" not in api_json.METADATA_FIELDS
    assert api_json.OBJECT_FIELDS >= {"apiVersion", "kind", "metadata", "spec", "status", "value", "preemptionPolicy"}
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "hi"},
          "value": 2**40, "preemptionPolicy": "Never", "globalDefault": False, "description": "d"}
    assert api_json.watch_event(_line(pc))["object"] == pc


@pytest.mark.parametrize("line", [
    b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
    b'"message":"too old resource version: 1 (5)","reason":"Expired","code":410}}',
    b'{"type":"SURPRISE","object":{"kind":"Pod","metadata":{"name":"a","managedFields":[]},"odd":1}}',
    b'{"type":"ADDED","object":{"kind":"Pod","metadata":"not a map","odd":1}}',
    b'{"type":"ADDED","object":null}',
    b'{"type":"ADDED"}',
    b'[1,2]',
])
def test_what_is_not_an_objects_change_is_decoded_whole(line: bytes) -> None:
    """An ERROR's Status keeps its code and message (a 410 starts a relist), and whatever does
    not have an object change's shape reaches the source as it was sent, to be refused there."""
    assert api_json.watch_event(line) == json.loads(line)


def test_integers_of_any_size_and_bad_bytes() -> None:
    obj = {"kind": "Pod", "metadata": {"name": "a", "generation": 2**128}, "spec": {"priority": -(2**128) - 5}}
    assert api_json.watch_event(_line(obj))["object"] == obj
    for bad in (b'{"type":"ADDED","object":{', b"", b"\xff", b'{"type":"ADDED","object":{"metadata":{"name":"a"}}} x'):
        with pytest.raises(ValueError):
            api_json.watch_event(bad)
        with pytest.raises(ValueError):
            api_json.list_document(bad)
    assert api_json.list_document(b'{"metadata":{},"items":null}') == {"metadata": {}, "items": None}
    assert api_json.list_document(b'{"metadata":{},"items":[1]}') == {"metadata": {}, "items": [1]}
