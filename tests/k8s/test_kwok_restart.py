"""The session's control plane outlives a KWOK crash: a KWOK that exited during one test is
restarted before the next (`conftest._kwok_alive`), which then gets Ready nodes, and the restart
is reported. The two tests run in file order: the first leaves KWOK dead, as its own data race
once did in the middle of a session."""

from __future__ import annotations

from tests.k8s import conftest
from tests.k8s.conftest import K8s


def test_kwok_dies(k8s: K8s) -> None:
    k8s.cp.kwok.kill()
    assert not k8s.cp.kwok.running()


def test_the_next_test_finds_kwok_restarted_and_said_so(k8s: K8s) -> None:
    assert k8s.cp.kwok.running()
    assert any("test_the_next_test_finds_kwok_restarted" in line for line in conftest.KWOK_RESTARTS)
    node = k8s.gpu_node()
    assert node["metadata"]["name"]
