"""Names of KAI's API that the core shares with the ingest layer."""

SCHEDULER_NAME = "kai-scheduler"
