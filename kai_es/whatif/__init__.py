"""What-if: the workload recorded in a log, re-run under another policy or cluster
(`kai-es whatif`). `workload` extracts it, `changes` alters it, `run` plays it through the
scheduler, `compare` sets the recorded run and the counterfactual side by side."""
