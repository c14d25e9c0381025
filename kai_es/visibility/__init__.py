"""What kai-es shows about a log beyond its decisions: the per-queue numbers dashboards are built
on (`queue_metrics`)."""
