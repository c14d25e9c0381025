"""Compiled extensions of kai-es (built by cffi from ``csrc/``).

``kai_es._native._packer`` is produced by ``kai_es/_native/build_packer.py``
(``pip install -e . --no-build-isolation`` or ``python3 setup.py build_ext --inplace``).
This package never imports it eagerly: ``kai_es.scheduling.packing.load_packer``
does, and raises a clear error if it has not been built.
"""
