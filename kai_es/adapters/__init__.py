"""Implementations of the ports: logs, clocks, ids, cluster sources and actuators."""
