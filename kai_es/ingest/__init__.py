"""Kubernetes objects to events: pure translation and quantity parsing."""
