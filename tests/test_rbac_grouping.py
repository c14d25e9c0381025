"""The informer's RBAC grows with the podgrouper's table, and only by `get`: every kind the
grouping source may read (`podgrouper.fetched_kinds`) is readable by the ClusterRole, and the
owners' rules grant nothing but `get`."""

from __future__ import annotations

from pathlib import Path

import yaml

from kai_es.ingest import podgrouper as pg

ROOT = Path(__file__).resolve().parents[1]


def test_every_fetched_kind_is_gettable_and_nothing_more() -> None:
    role = yaml.safe_load((ROOT / "deploy" / "rbac" / "clusterrole.yaml").read_text())
    gettable = {(group, resource) for rule in role["rules"] if "get" in rule["verbs"]
                for group in rule["apiGroups"] for resource in rule["resources"]}
    for group, kind in pg.fetched_kinds():
        assert (group, pg.plural_of(group, kind)) in gettable, (group, kind)
    owners = {(g, r) for g, r in gettable if g not in ("", "scheduling.k8s.io", "scheduling.run.ai", "kai.scheduler")}
    assert owners == {(g, pg.plural_of(g, k)) for g, k in pg.fetched_kinds() if g}
    for rule in role["rules"]:
        if set(rule["apiGroups"]) & {g for g, _ in owners}:
            assert rule["verbs"] == ["get"], rule
