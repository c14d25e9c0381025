"""Names of KAI's API that the core shares with the ingest layer."""

import re

#: the scheduler name kai-es answers to by default (KAI's): pods whose `spec.schedulerName` is
#: the configured name (`SchedulerConfig.scheduler_name`, KAI's `--scheduler-name`) are kai-es's
SCHEDULER_NAME = "kai-scheduler"

#: a Pod's `spec.schedulerName` must be a DNS-1123 subdomain
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def scheduler_name_problem(name: object) -> str:
    """Why `name` cannot be a scheduler name ("" when it can): a DNS-1123 subdomain, at most 253
    characters, as the apiserver requires of a pod's `spec.schedulerName`."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        return (f"{name[:60]!r} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
                "at most 253 characters), as a pod's spec.schedulerName must be")
    return ""
