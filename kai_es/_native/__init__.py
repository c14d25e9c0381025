"""Compiled extensions of kai-es (built by cffi from ``csrc/``).

``kai_es._native._packer`` and ``kai_es._native._framing`` are produced by
``kai_es/_native/build.py``
(``pip install -e . --no-build-isolation`` or ``python3 setup.py build_ext --inplace``).
This package never imports them eagerly: ``kai_es.scheduling.packing.load_packer``
imports the packer, and raises a clear error if it has not been built;
``kai_es.adapters.framing.load_indexer`` imports the line indexer of the file event
log, and falls back to its pure-Python twin (with a warning in the log) if it has not.
"""
