"""The imperative shell: informer, scheduler and binder loops over the ports."""
