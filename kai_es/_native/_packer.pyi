# Stub for the cffi-generated extension module (see build_packer.py).
from typing import Any

ffi: Any
lib: Any
