"""The one-line summary of an event's payload that `kai-es events` and `kai-es serve` show, and
the check both make of their glob filters. Pure."""

from __future__ import annotations

from kai_es.events import payloads as p


def brief(data: p.Payload) -> str:
    """What one line of `kai-es events` says about an event after its type and subject ("" for
    an event whose type and subject say it all)."""
    if isinstance(data, (p.BindingDecided, p.PodPipelined)):
        return f"-> {data.node} gpus={data.gpu_devices}"
    if isinstance(data, p.PodUnschedulable):
        return "; ".join(f"{r.code}: {r.message}" for r in data.reasons)
    if isinstance(data, p.PodBound):
        return f"bound to {data.node}"
    if isinstance(data, p.PodBindFailed):
        return f"bind to {data.node} failed: {data.message}"
    if isinstance(data, p.PodObserved):
        return f"{data.phase}{' on ' + data.node_name if data.node_name else ''}"
    if isinstance(data, p.EvictionDecided):
        if data.to_node:
            return f"{data.action}: moves {data.node} -> {data.to_node}: {data.reason}"
        return f"{data.action}: {data.reason}"
    if isinstance(data, p.PodEvicted):
        return f"evicted from {data.node}"
    if isinstance(data, p.CycleCompleted):
        return (f"cycle {data.cycle}: {data.bound} bound, {data.pipelined} pipelined, {data.evicted} evicted, "
                f"{data.unschedulable} pending")
    if isinstance(data, p.ObjectRejected):
        return f"{data.kind} {data.namespace}/{data.name} at {data.path}: {data.reason}"
    return ""


def unbalanced_brackets(pattern: str) -> bool:
    """Whether glob `pattern` has a '[' that fnmatch would take literally for want of a ']'
    (`kai-es events --type/--subject` and the filters of `kai-es serve` refuse it)."""
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            close = pattern.find("]", j)
            if close < 0:
                return True
            i = close
        i += 1
    return False
