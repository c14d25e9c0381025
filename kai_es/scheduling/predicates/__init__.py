"""Placement predicates: every check Kubernetes and KAI make before a pod lands on a node, one
module each, combined per cycle by `eligibility.Eligibility` into the 0/1 mask the packer reads.

Order (a node excluded by several checks is counted under the first):
  1. cordon, taints/tolerations, node pool, `nodeSelector`, required node affinity
     (`taints`, `node_affinity`) — reported together as today's `not_eligible`;
  2. node affinity of bound PersistentVolumes (`volumes`);
  3. scalar resources: capacity, then what is free (`resources`);
  4. host ports (`host_ports`);
  5. required pod affinity, pod anti-affinity, existing pods' anti-affinity (`pod_affinity`).
Pod-level checks (missing claims, volumes or ConfigMaps) make a pod unschedulable on every node
before any placement is tried. Preferred node and pod affinity rank nodes (`Eligibility.levels`).
"""
