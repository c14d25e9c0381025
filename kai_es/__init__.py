"""kai-es: an event-sourced Kubernetes GPU scheduler with KAI Scheduler semantics.

Every input and every decision is an event in one totally ordered log; state is a pure fold of it.
"""

__version__ = "0.1.0"
