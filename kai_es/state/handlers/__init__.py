"""The reducer's handlers, one module per entity (see `kai_es.state.reducer`, which maps each
event type to its handler and is the one entry point: `apply`)."""
