"""The simulated cluster and the discrete-event driver that runs the real services against it."""
