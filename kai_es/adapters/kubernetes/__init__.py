"""Kubernetes adapters over kubernetes-asyncio: a ClusterSource (list + watch; `grouping` wraps
it to give pods KAI's default PodGroups and hide GPU reservation pods), a ClusterActuator
(pods/binding, the Eviction API; `gpushare` prepares shared GPUs), and binder followers that
release GPU reservations (`reservations`) and write status back (`status`).

kubernetes-asyncio is the maintained asyncio client generated from Kubernetes' OpenAPI spec and
released in step with Kubernetes minors. Its generated models are kept off the hot paths (see
INFRA.md: decoding a watch event into models costs ~6x reading the raw JSON): everything here
reads and writes plain dicts with `_preload_content=False`.
"""
