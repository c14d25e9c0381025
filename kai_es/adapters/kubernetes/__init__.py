"""Kubernetes adapters over kubernetes-asyncio: a ClusterSource (list + watch) and a
ClusterActuator (pods/binding, the Eviction API).

kubernetes-asyncio is the maintained asyncio client generated from Kubernetes' OpenAPI spec and
released in step with Kubernetes minors. Its generated models are kept off the hot paths (see
INFRA.md: decoding a watch event into models costs ~6x reading the raw JSON): everything here
reads and writes plain dicts with `_preload_content=False`.
"""
