"""What a pod needs on its node, as Kubernetes computes it (component-helpers' PodRequests with
status resources): containers summed, sidecars (init containers with `restartPolicy: Always`)
added and counted under the init containers after them, the largest init container, overhead;
and a container being resized in place counted at its effective requests. Manifests as users
write them; each case checked against the formula written out by hand."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kai_es.ingest import translate as tr


def _pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
         status: dict[str, Any] | None = None, overhead: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "kai-scheduler", "containers": containers}
    if init:
        spec["initContainers"] = init
    if overhead:
        spec["overhead"] = overhead
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d", "uid": "u"},
            "spec": spec, "status": status or {"phase": "Pending"}}


def _c(name: str, cpu: str, always: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": {"requests": {"cpu": cpu}}}
    if always:
        c["restartPolicy"] = "Always"
    return c


def _cpu(obj: dict[str, Any]) -> int:
    return tr.pod(obj).requests.milli_cpu


def test_a_sidecar_adds_to_the_containers_and_to_the_init_containers_after_it() -> None:
    # istio-style: a native sidecar (500m) started before a 2-CPU init step; app 1 CPU
    pod = _pod([_c("app", "1")], init=[_c("proxy", "500m", always=True), _c("migrate", "2")])
    assert _cpu(pod) == max(1000 + 500, 500 + 2000)  # the init step runs beside the sidecar: 2.5
    # an init container before the sidecar runs alone
    pod = _pod([_c("app", "1")], init=[_c("migrate", "2"), _c("proxy", "500m", always=True)])
    assert _cpu(pod) == max(1000 + 500, 2000)
    # without sidecars: the largest init container, else the containers' sum, plus overhead
    pod = _pod([_c("a", "1"), _c("b", "1")], init=[_c("i", "3")], overhead={"cpu": "250m"})
    assert _cpu(pod) == 3000 + 250


def _resizing(spec_cpu: str, actual: str, allocated: str, infeasible: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": [
        {"name": "app", "allocatedResources": {"cpu": allocated}, "resources": {"requests": {"cpu": actual}}}]}
    if infeasible:
        status["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
    return _pod([_c("app", spec_cpu)], status=status)


def test_a_resize_in_progress_counts_the_largest_of_spec_actuated_and_allocated() -> None:
    assert _cpu(_resizing("4", "1", "4")) == 4000  # growing: the new size already
    assert _cpu(_resizing("1", "4", "1")) == 4000  # shrinking: the old size until it is actuated
    assert _cpu(_resizing("4", "1", "1", infeasible=True)) == 1000  # never resized: what it has
    assert _cpu(_resizing("2", "2", "2")) == 2000
    # a status without resources (an older kubelet, a pending pod): the spec
    pod = _pod([_c("app", "3")], status={"phase": "Running", "containerStatuses": [{"name": "app"}]})
    assert _cpu(pod) == 3000


def test_a_malformed_status_quantity_is_refused_naming_it() -> None:
    pod = _resizing("1", "lots", "1")
    with pytest.raises(tr.IngestError, match=r"status.containerStatuses\[0\].resources.requests.cpu"):
        tr.pod(pod)
    pod = _resizing("1", "1", "1")
    pod["status"]["containerStatuses"][0]["allocatedResources"] = ["cpu"]
    with pytest.raises(tr.IngestError, match=r"status.containerStatuses\[0\].allocatedResources"):
        tr.pod(pod)


@given(st.integers(0, 64), st.integers(0, 64), st.integers(0, 64), st.booleans())
def test_the_effective_request_is_kubernetes_formula(spec: int, actual: int, allocated: int, infeasible: bool) -> None:
    got = _cpu(_resizing(str(spec), str(actual), str(allocated), infeasible))
    want = max(actual, allocated) if infeasible else max(spec, actual, allocated)
    assert got == want * 1000
