# Stub for the cffi-generated extension module (see build_framing.py).
from typing import Any

ffi: Any
lib: Any
