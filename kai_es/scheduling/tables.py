"""The packer's view of the cluster, kept up to date incrementally between cycles.

Contract: `tables(state)` returns node names, node states and the idle and future
`ArrayPackTable`s in node-name order, equal to building them from scratch (`build_tables`), at
O(changes) cost: rows are refreshed only for nodes whose usage changed since the last call
(`state.dirty_nodes`), and everything is rebuilt only when the node set or a node's spec
changed (`state.node_set_version`). The cache lives in `state.caches` and is derived data: it is
never part of a snapshot or digest. Callers must not mutate the returned tables (copy them).

`changed_since(state, seen)` lets other cross-cycle caches follow the same changes without
consuming `dirty_nodes` themselves: each call of `tables` that rebuilt the tables or refreshed
rows is a generation, and every node remembers the generation its pods or usage last changed in
(kept by name across a rebuild).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kai_es.scheduling.packing import ArrayPackTable
from kai_es.state.model import ClusterState, NodeState

_KEY = "scheduling.tables"


def _rows(n: NodeState) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """idle cpu/mem/pods, future cpu/mem/pods, idle device free, future device free, sharers"""
    idle = [max(0, n.free_milli_cpu), max(0, n.free_memory_bytes), max(0, n.free_pods)]
    future = [max(0, n.free_milli_cpu + n.releasing_milli_cpu),
              max(0, n.free_memory_bytes + n.releasing_memory_bytes),
              max(0, n.free_pods + n.releasing_pods)]
    dev_idle = [max(0, 1000 - u) for u in n.device_used]
    dev_future = [min(1000, max(0, 1000 - u + r)) for u, r in zip(n.device_used, n.device_releasing)]
    return idle, future, dev_idle, dev_future, list(n.device_sharers)


def build_tables(state: ClusterState) -> tuple[list[str], list[NodeState], ArrayPackTable, ArrayPackTable]:
    """Node names, node states and the idle and future tables, built from scratch."""
    names = list(state.node_names)
    nodes = [state.nodes[n] for n in names]
    gpu_start = [0]
    for n in nodes:
        gpu_start.append(gpu_start[-1] + len(n.device_used))
    rows = [_rows(n) for n in nodes]
    dev_total = [n.spec.gpu_memory_mib for n in nodes for _ in n.device_used]
    sharers = [s for r in rows for s in r[4]]
    shared = [1 if s > 0 else 0 for s in sharers]
    common = dict(alloc_milli_cpu=[n.spec.milli_cpu for n in nodes], gpu_start=gpu_start,
                  dev_total_memory_mib=dev_total, dev_shared=shared, dev_frac_holders=sharers)
    idle = ArrayPackTable(free_milli_cpu=[r[0][0] for r in rows], free_memory_bytes=[r[0][1] for r in rows],
                          free_pods=[r[0][2] for r in rows], dev_free_milli=[d for r in rows for d in r[2]],
                          **common)
    future = ArrayPackTable(free_milli_cpu=[r[1][0] for r in rows], free_memory_bytes=[r[1][1] for r in rows],
                            free_pods=[r[1][2] for r in rows], dev_free_milli=[d for r in rows for d in r[3]],
                            **common)
    return names, nodes, idle, future


@dataclass(slots=True)
class _Cache:
    version: int = -1
    names: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    idle: ArrayPackTable | None = None
    future: ArrayPackTable | None = None
    #: the node states in `names` order (the same objects until the node set changes, which
    #: rebuilds the tables)
    nodes: list[NodeState] = field(default_factory=list)
    #: bumped by every call that rebuilt the tables or refreshed a row
    generation: int = 0
    #: the generation each node's row last changed in (by node index)
    changed_at: array[int] = field(default_factory=lambda: array("q"))
    #: the generation the tables were last rebuilt in (node indexes change then)
    rebuilt_at: int = 0
    #: the indexes whose rows the last generation refreshed, in order (when it refreshed rows)
    last_changed: list[int] = field(default_factory=list)
    #: each node's labels in `names` order, once asked for (`labels_of`); None after a rebuild
    labels: list[Mapping[str, str]] | None = None


def tables(state: ClusterState) -> tuple[list[str], list[NodeState], ArrayPackTable, ArrayPackTable]:
    """The current tables (see module docstring)."""
    cache = state.caches.get(_KEY)
    if not isinstance(cache, _Cache):
        cache = _Cache()
        state.caches[_KEY] = cache
    if cache.version != state.node_set_version or cache.idle is None or cache.future is None:
        old_index, old_changed, dirty = cache.index, cache.changed_at, state.dirty_nodes
        cache.names, cache.nodes, cache.idle, cache.future = build_tables(state)
        cache.labels = None
        cache.index = {name: i for i, name in enumerate(cache.names)}
        cache.version = state.node_set_version
        cache.generation += 1
        cache.rebuilt_at = generation = cache.generation
        # a node's pods and usage changed now if it is new or dirty; else when they last did
        cache.changed_at = array("q", [old_changed[old_index[name]] if name in old_index and name not in dirty
                                       else generation for name in cache.names])
        state.dirty_nodes.clear()
    elif state.dirty_nodes:
        cache.generation += 1
        cache.last_changed = _refresh_rows(state, cache.index, cache.idle, cache.future, cache.changed_at,
                                           cache.generation)
        state.dirty_nodes.clear()
    return cache.names, cache.nodes, cache.idle, cache.future


def index_of(state: ClusterState, names: Sequence[str]) -> dict[str, int]:
    """name -> its position in `names`: the tables' own index when `names` is the tables' node
    list (`tables(state)[0]`; kept with it, so callers must not mutate it), else built."""
    cache = state.caches.get(_KEY)
    if isinstance(cache, _Cache) and cache.names is names:
        return cache.index
    return {name: i for i, name in enumerate(names)}


def labels_of(state: ClusterState, names: Sequence[str], nodes: Sequence[NodeState]) -> Sequence[Mapping[str, str]]:
    """Each node's labels, in `nodes` order: kept with the tables when `names` and `nodes` are
    the tables' own (`tables(state)`; a label changes only with its node's spec, which rebuilds
    them, so the list is made once per rebuild, not once per cycle: read only), else built."""
    cache = state.caches.get(_KEY)
    if isinstance(cache, _Cache) and cache.names is names and cache.nodes is nodes:
        if cache.labels is None:
            cache.labels = [n.spec.labels for n in nodes]
        return cache.labels
    return [n.spec.labels for n in nodes]


def generation(state: ClusterState) -> int:
    """The tables' generation as of the last call of `tables` (-1 before the first)."""
    cache = state.caches.get(_KEY)
    return cache.generation if isinstance(cache, _Cache) and cache.idle is not None else -1


def changed_since(state: ClusterState, seen: int) -> tuple[int, list[int], bool]:
    """As of the last call of `tables`: (its generation, the indexes of the nodes whose pods or
    usage changed after generation `seen` (new nodes included), in index order, and whether the
    tables were rebuilt after `seen`: then every index may name another node, and a node's spec,
    so its row, may have changed too). Before the tables are first built: (-1, [], True)."""
    cache = state.caches.get(_KEY)
    if not isinstance(cache, _Cache) or cache.idle is None:
        return -1, [], True
    if cache.generation == seen:
        return seen, [], False
    if cache.generation == seen + 1 and cache.rebuilt_at <= seen:  # (a cycle's: no pass over every node)
        return cache.generation, cache.last_changed, False
    return (cache.generation, [i for i, at in enumerate(cache.changed_at) if at > seen],
            cache.rebuilt_at > seen)


def _refresh_rows(state: ClusterState, index: dict[str, int], idle: ArrayPackTable,
                  future: ArrayPackTable, changed_at: array[int], generation: int) -> list[int]:
    """Rewrite the rows of the dirty nodes in place: the values of `_rows`, without building
    its lists (this runs for every node that changed, every cycle); returns their indexes, in
    order."""
    i_cpu, i_mem, i_pods = idle.free_milli_cpu, idle.free_memory_bytes, idle.free_pods
    f_cpu, f_mem, f_pods = future.free_milli_cpu, future.free_memory_bytes, future.free_pods
    i_dev, f_dev = idle.dev_free_milli, future.dev_free_milli
    i_holders, f_holders = idle.dev_frac_holders, future.dev_frac_holders
    i_shared, f_shared = idle.dev_shared, future.dev_shared
    gpu_start = idle.gpu_start
    nodes = state.nodes
    changed: list[int] = []
    for name in sorted(state.dirty_nodes):
        i = index.get(name)
        if i is None:
            continue
        n = nodes[name]
        changed_at[i] = generation
        changed.append(i)
        spec = n.spec
        # (conditional expressions rather than max(0, x): same values, no call per field)
        cpu = spec.milli_cpu - n.used_milli_cpu
        mem = spec.memory_bytes - n.used_memory_bytes
        pods = spec.max_pods - n.used_pods
        i_cpu[i] = cpu if cpu > 0 else 0
        i_mem[i] = mem if mem > 0 else 0
        i_pods[i] = pods if pods > 0 else 0
        cpu += n.releasing_milli_cpu
        mem += n.releasing_memory_bytes
        pods += n.releasing_pods
        f_cpu[i] = cpu if cpu > 0 else 0
        f_mem[i] = mem if mem > 0 else 0
        f_pods[i] = pods if pods > 0 else 0
        j = gpu_start[i]
        for used, releasing, sharers in zip(n.device_used, n.device_releasing, n.device_sharers):
            free = 1000 - used
            i_dev[j] = free if free > 0 else 0
            free += releasing
            f_dev[j] = 1000 if free > 1000 else (free if free > 0 else 0)
            i_holders[j] = f_holders[j] = sharers
            i_shared[j] = f_shared[j] = 1 if sharers > 0 else 0
            j += 1
    changed.sort()  # (names sort as their indexes do; kept exact regardless)
    return changed


class Follower(Protocol):
    """A cache derived from the nodes, kept in step with the tables (`follow`)."""

    #: the tables' generation it is up to date with
    seen: int
    #: how many times `follow` handed it out (whoever asks: a cycle, the upkeep)
    asked: int


F = TypeVar("F", bound=Follower)


def follow(state: ClusterState, key: str, kind: type[F], fresh: Callable[[], F],
           update: Callable[[F, list[int], bool], F]) -> F:
    """The cache `state.caches[key]` (of type `kind`) brought up to date with the tables: made
    by `fresh()` the first time, then whenever the tables changed since it last was,
    `update(cache, changed, rebuilt)` (what `changed_since` answers) returns it up to date. Its
    `asked` counts the calls that returned it."""
    tables(state)  # (first: it may refresh rows, a new generation)
    found = state.caches.get(key)
    if not isinstance(found, kind):
        made = fresh()
        made.seen = changed_since(state, -2)[0]
        made.asked = 1
        state.caches[key] = made
        return made
    generation, changed, rebuilt = changed_since(state, found.seen)
    if generation == found.seen:
        found.asked += 1
        return found
    now = update(found, changed, rebuilt)
    now.seen = generation
    now.asked = found.asked + 1
    state.caches[key] = now
    return now
