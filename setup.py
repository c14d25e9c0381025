from setuptools import setup

setup(cffi_modules=[
    "kai_es/_native/build_packer.py:ffibuilder",
    "kai_es/_native/build_framing.py:ffibuilder",
])
