"""Building a kubernetes-asyncio ApiClient from a kubeconfig file or the in-cluster config."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from kai_es.ports import SetupError


class ClusterConfigError(SetupError):
    """No usable cluster configuration (kubeconfig or in-cluster); the message says why."""


async def api_client(kubeconfig: str | os.PathLike[str] | None = None, *,
                     context: str | None = None) -> client.ApiClient:
    """An ApiClient for `kubeconfig` (its current context unless `context` is given), or, when
    `kubeconfig` is None, for $KUBECONFIG if set, else the in-cluster service-account config.

    A missing or unreadable configuration raises `ClusterConfigError`. Must be called inside
    the running event loop (the client's aiohttp session binds to it);
    the caller closes it (`await c.close()`, or `async with`).
    """
    cfg = client.Configuration()
    path = kubeconfig if kubeconfig is not None else os.environ.get("KUBECONFIG")
    try:
        if path:
            await config.load_kube_config(config_file=str(Path(path)), context=context,
                                          client_configuration=cfg, persist_config=False)
        else:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        where = f"kubeconfig {path}" if path else "the in-cluster config (no --kubeconfig, no $KUBECONFIG)"
        raise ClusterConfigError(f"{where}: {exc}") from None
    return client.ApiClient(configuration=cfg)
