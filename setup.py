from setuptools import setup

setup(cffi_modules=[
    "kai_es/_native/build.py:packer_ffi",
    "kai_es/_native/build.py:framing_ffi",
])
