#!/usr/bin/env python3
"""Build the kai-es container image without a Docker daemon: the image `deploy/Dockerfile`
describes, made from Debian packages and wheels, written as an OCI image layout.

CLI::

    python3 tools/build_image.py build [--out build/image] [--tag kai-es.local/kai-es:0.1.0]
        # prints the manifest digest, the size, and where the layout and the archive are:
        #   <out>/oci/            an OCI image layout (oci-layout, index.json, blobs/sha256/...)
        #   <out>/kai-es.oci.tar  the same layout as one tar (plus a docker-style manifest.json):
        #                         `ctr -n k8s.io images import <out>/kai-es.oci.tar`
    python3 tools/build_image.py fetch   # only download the locked .debs and wheels into the cache
    python3 tools/build_image.py lock    # re-resolve deploy/image/*.lock (a new image; commit them)

The same image as `deploy/Dockerfile` (that file is the recipe for a machine with Docker; keep the
two in step): CPython 3.11 (Debian bookworm's, ABI cp311 like the wheel; pyproject asks >=3.11),
the kai-es wheel built from the checkout with its C packer and log indexer compiled, its
dependencies installed from wheels, no compiler and no pip in any layer, user and group 10001,
``WORKDIR /tmp``, ``ENTRYPOINT ["kai-es"]``, ``CMD ["--help"]``, ``PYTHONDONTWRITEBYTECODE=1``
and ``PYTHONUNBUFFERED=1``. Bytecode is compiled at build time (hash-checked .pyc, so a read-only
root filesystem never needs a write and the fixed file times do not invalidate it).

How, step by step (everything but the rootfs chroot runs as the calling user; the chroot needs
root, as on CI):

1. Debian packages: ``deploy/image/debian.lock`` names every package of the base (the closure of
   ROOT_PACKAGES that apt resolves on an empty system, recommends excluded) with its version and
   SHA-256. ``apt-get download`` fetches each into ``$KAI_ES_CACHE/image/debs`` (checked against
   the lock); they are unpacked with ``dpkg-deb --fsys-tarfile`` (no maintainer script runs: the
   image has no shell), without docs (copyright files kept), man pages, info and locales.
   ``/var/lib/dpkg/status`` lists them, so image scanners see what is inside.
2. Wheels: ``deploy/image/requirements.lock`` pins every runtime dependency with its hash
   (``pip download --require-hashes --only-binary=:all:``); ``deploy/image/build-requirements.lock``
   pins the build backend (setuptools, cffi), installed into a cached virtualenv that builds the
   kai-es wheel (``pip wheel --no-build-isolation``) from a copy of the checkout at a fixed path,
   without debug information (the compiled packer does not depend on where the checkout is).
   Wheels are unpacked into ``/usr/local/lib/python3.11/dist-packages`` by a small installer here
   (scripts get ``#!/usr/bin/python3.11``); pip itself never enters the image.
3. Two layers, base (Debian) and app (``/usr/local``), each a tar with sorted entries, every
   mtime SOURCE_DATE_EPOCH (the commit's time unless set), owner 0:0 without names, gzip with
   mtime 0; config and manifest JSON with sorted keys. Same inputs, same digest.

Caches (outside the repo): ``${KAI_ES_CACHE:-~/.cache/kai-es}/image/``: ``debs/`` and ``wheels/``
(files named by their content's hash, checked again when used), ``buildenv-<hash of the build
lock>/`` (the build backend's virtualenv), ``work/`` (temporary trees, removed after a build).
The tool never overwrites a file it did not create: ``--out`` must be absent, empty, or a
directory this tool made (it holds the marker file ``.kai-es-build-image``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
LOCK_DIR = ROOT / "deploy" / "image"
DEBIAN_LOCK = LOCK_DIR / "debian.lock"
REQUIREMENTS_LOCK = LOCK_DIR / "requirements.lock"
BUILD_REQUIREMENTS_LOCK = LOCK_DIR / "build-requirements.lock"

#: Debian suite of the base: its python3.11 is what the wheel's cp311 ABI needs
DEBIAN_SUITE = "bookworm"
#: what the base is the apt closure of: the interpreter, the C++ runtime of a compiled wheel
#: (aiohttp's frozenlist), CA certificates (Kafka over TLS), /etc/services and /etc/os-release
ROOT_PACKAGES = ("python3.11", "libstdc++6", "ca-certificates", "netbase", "base-files")
PYTHON = "/usr/bin/python3.11"
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
SCRIPTS = "usr/local/bin"
#: paths under these are not unpacked from the .debs (like a slim image's dpkg path-excludes);
#: /usr/share/doc/<package>/copyright is kept
EXCLUDED_PREFIXES = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/",
                     "usr/share/lintian/", "usr/share/bug/", "usr/share/doc-base/")
#: the app layer is everything under this; the base layer everything else
APP_PREFIX = "usr/local"

USER_ID = 10001  # the chart's podSecurityContext.runAsUser/runAsGroup
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
ENTRYPOINT = ["kai-es"]
CMD = ["--help"]
WORKDIR = "/tmp"
#: what `git archive`-like copying takes from the checkout (the Dockerfile's COPY lines)
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "csrc", "kai_es")
MARKER = ".kai-es-build-image"
LAYOUT_DIR = "oci"
ARCHIVE = "kai-es.oci.tar"
DEFAULT_TAG_REPO = "kai-es.local/kai-es"

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


class BuildError(Exception):
    """A build step failed; the message says which and what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("KAI_ES_CACHE") or Path.home() / ".cache" / "kai-es") / "image"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    return res


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------
# Locks


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    arch: str
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.sha256}_{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"


def read_debian_lock(path: Path = DEBIAN_LOCK) -> list[DebPackage]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version, arch, sha = line.split()
            out.append(DebPackage(name, version, arch, sha))
    return out


def _apt_closure(packages: Sequence[str]) -> list[tuple[str, str, str]]:
    """(name, version, arch) of what apt would install on an empty system, in apt's order."""
    with tempfile.TemporaryDirectory() as tmp:
        status = Path(tmp) / "status"
        status.write_text("")
        res = _run(["apt-get", "-s", "-o", f"Dir::State::status={status}",
                    "-o", "APT::Install-Recommends=false", "-o", "APT::Install-Suggests=false",
                    "install", *packages])
    found = []
    for line in res.stdout.splitlines():
        m = re.match(r"Inst (\S+) \((\S+) .*\[(\w+)\]\)", line)
        if m:
            name, version, arch = m.groups()
            found.append((name.split(":")[0], version, arch))
    if not found:
        raise BuildError(f"apt resolved nothing for {packages}:\n{res.stdout}")
    return found


def _apt_sha256(name: str, version: str, arch: str) -> str:
    res = _run(["apt-cache", "show", "--no-all-versions", f"{name}:{arch}={version}"])
    m = re.search(r"^SHA256: (\w+)$", res.stdout, re.M)
    if not m:
        raise BuildError(f"apt-cache shows no SHA256 for {name}={version}")
    return m.group(1)


def lock_debian(path: Path = DEBIAN_LOCK) -> list[DebPackage]:
    codename = _run(["sh", "-c", ". /etc/os-release && echo $VERSION_CODENAME"]).stdout.strip()
    if codename != DEBIAN_SUITE:
        raise BuildError(f"lock on a Debian {DEBIAN_SUITE} machine (its apt lists); this is {codename!r}")
    pkgs = [DebPackage(n, v, a, _apt_sha256(n, v, a)) for n, v, a in _apt_closure(ROOT_PACKAGES)]
    pkgs.sort(key=lambda p: p.name)
    lines = [f"# Debian {DEBIAN_SUITE} packages of the kai-es image's base: the apt closure of",
             f"# {' '.join(ROOT_PACKAGES)} (tools/build_image.py ROOT_PACKAGES). Regenerate with",
             "# `python3 tools/build_image.py lock` (after apt-get update) when Debian drops a version.",
             "# name version arch sha256"]
    lines += [f"{p.name} {p.version} {p.arch} {p.sha256}" for p in pkgs]
    path.write_text("\n".join(lines) + "\n")
    return pkgs


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dependencies_digest(requirements: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]


def _wheel_platform_args() -> list[str]:
    # the image's interpreter and libc: CPython 3.11 on glibc 2.36 (bookworm), x86_64
    platforms = ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                 *(f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1))]
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11", "--abi", "cp311"]
    for p in platforms:
        args += ["--platform", p]
    return args


def _pip_resolve(requirements: Sequence[str]) -> list[tuple[str, str, str]]:
    """(name, version, sha256 of the chosen file) of the full closure of `requirements`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
              "--report", str(report), "--target", str(Path(tmp) / "t"), *_wheel_platform_args(),
              *requirements])
        data = json.loads(report.read_text())
    out = []
    for item in data["install"]:
        meta, info = item["metadata"], item["download_info"]
        out.append((meta["name"], meta["version"], info["archive_info"]["hashes"]["sha256"]))
    return sorted(out, key=lambda t: t[0].lower())


def lock_python() -> None:
    deps = list(_pyproject()["project"]["dependencies"])
    lines = ["# Every runtime dependency of the kai-es image (the closure of pyproject's",
             f"# [project].dependencies, digest {_dependencies_digest(deps)}), one wheel each for CPython",
             "# 3.11 / manylinux x86_64. Regenerate with `python3 tools/build_image.py lock`."]
    lines += [f"{n}=={v} --hash=sha256:{h}" for n, v, h in _pip_resolve(deps)]
    REQUIREMENTS_LOCK.write_text("\n".join(lines) + "\n")
    build = list(_pyproject()["build-system"]["requires"])
    lines = ["# The build backend of the kai-es wheel (the closure of pyproject's",
             f"# [build-system].requires, digest {_dependencies_digest(build)}).",
             "# Regenerate with `python3 tools/build_image.py lock`."]
    lines += [f"{n}=={v} --hash=sha256:{h}" for n, v, h in _pip_resolve(build)]
    BUILD_REQUIREMENTS_LOCK.write_text("\n".join(lines) + "\n")


def _check_python_locks() -> None:
    pyproject = _pyproject()
    for lock, deps in ((REQUIREMENTS_LOCK, pyproject["project"]["dependencies"]),
                       (BUILD_REQUIREMENTS_LOCK, pyproject["build-system"]["requires"])):
        if f"digest {_dependencies_digest(deps)}" not in lock.read_text():
            raise BuildError(f"{lock.relative_to(ROOT)} is stale (pyproject's requirements changed): "
                             "run `python3 tools/build_image.py lock`")


# ---------------------------------------------------------------------------------------------
# Fetching into the cache


def fetch_debs(packages: Sequence[DebPackage]) -> list[Path]:
    """Each locked .deb from the cache, downloaded by apt when missing; its hash checked."""
    debs = cache_root() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not (debs / p.file_name).exists()]
    if missing:
        with tempfile.TemporaryDirectory(dir=debs) as tmp:
            os.chmod(tmp, 0o755)  # apt's download sandbox user must be able to write... or root
            res = subprocess.run(["apt-get", "download", "-o", "APT::Sandbox::User=root",
                                  *(f"{p.name}:{p.arch}={p.version}" for p in missing)],
                                 cwd=tmp, capture_output=True, text=True)
            if res.returncode != 0:
                raise BuildError(
                    "apt-get download of the locked Debian packages failed: either the apt lists are "
                    "old (run `apt-get update`) or Debian no longer serves a locked version (run "
                    "`python3 tools/build_image.py lock`, a new image, and commit deploy/image/):\n"
                    + res.stderr[-3000:])
            for p in missing:
                got = list(Path(tmp).glob(f"{p.name}_*_{p.arch}.deb"))
                if len(got) != 1:
                    raise BuildError(f"apt-get download left {got} for {p.name}")
                if sha256_file(got[0]) != p.sha256:
                    raise BuildError(f"{got[0].name}: SHA-256 differs from deploy/image/debian.lock")
                got[0].rename(debs / p.file_name)
    out = []
    for p in packages:
        path = debs / p.file_name
        if sha256_file(path) != p.sha256:
            raise BuildError(f"cached {path} does not match its hash: delete it")
        out.append(path)
    return out


def fetch_wheels() -> list[Path]:
    """Every locked runtime wheel, from the cache or PyPI (pip checks the hashes)."""
    _check_python_locks()
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = re.findall(r"--hash=sha256:(\w+)", REQUIREMENTS_LOCK.read_text())
    by_hash = {sha256_file(w): w for w in wheels.glob("*.whl")}
    if not set(wanted) <= by_hash.keys():  # pip asks the index even when all are there: only then
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
              *_wheel_platform_args(), "--dest", str(wheels), "-r", str(REQUIREMENTS_LOCK)])
        by_hash = {sha256_file(w): w for w in wheels.glob("*.whl")}
    missing = [h for h in wanted if h not in by_hash]
    if missing:
        raise BuildError(f"pip download left no wheel with sha256 {missing[0]}")
    return [by_hash[h] for h in wanted]


def build_env() -> Path:
    """A cached virtualenv holding the locked build backend (keyed by the lock's content)."""
    _check_python_locks()
    if sys.version_info[:2] != (3, 11):
        raise BuildError(f"build the wheel with a CPython 3.11 (the image's ABI), not {sys.version}")
    key = hashlib.sha256(BUILD_REQUIREMENTS_LOCK.read_bytes() + sys.version.encode()).hexdigest()[:16]
    env = cache_root() / f"buildenv-{key}"
    if not (env / MARKER).exists():
        shutil.rmtree(env, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(env)])
        _run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--require-hashes",
              "--only-binary=:all:", "-r", str(BUILD_REQUIREMENTS_LOCK)])
        (env / MARKER).write_text("")
    return env


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    return int(_run(["git", "log", "-1", "--format=%ct"], cwd=ROOT).stdout.strip())


def revision() -> str:
    """HEAD's commit, with `-dirty` when the files the wheel is built from differ from it."""
    head = _run(["git", "rev-parse", "HEAD"], cwd=ROOT).stdout.strip()
    dirty = _run(["git", "status", "--porcelain", "--", *WHEEL_SOURCES], cwd=ROOT).stdout.strip()
    return head + ("-dirty" if dirty else "")


def build_wheel(work: Path) -> Path:
    """The kai-es wheel, built from the checkout's files (tracked and untracked, not ignored:
    what `COPY` would take) copied to a fixed path, so the compiled modules carry no path of
    the checkout."""
    env = build_env()
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                  *WHEEL_SOURCES], cwd=ROOT).stdout.split("\0")
    src = cache_root() / "work" / "src"  # fixed: it ends up in nothing, but keeps builds alike
    shutil.rmtree(src, ignore_errors=True)
    for rel in sorted(f for f in files if f):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    out = work / "wheel"
    child = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date_epoch()),
             # no debug info (it names the build directory) and no rpath to the build host's Python
             "CFLAGS": f"-g0 -ffile-prefix-map={src}=.", "LDSHARED": "gcc -shared",
             "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([str(env / "bin" / "python"), "-m", "pip", "wheel", "--quiet", "--no-deps",
          "--no-build-isolation", "--wheel-dir", str(out), str(src)], env=child, cwd=src)
    shutil.rmtree(src)
    (wheel,) = out.glob("kai_es-*.whl")
    return wheel


# ---------------------------------------------------------------------------------------------
# The root filesystem


def _excluded(name: str) -> bool:
    if not name.startswith(EXCLUDED_PREFIXES):
        return False
    parts = name.split("/")
    return not (name.startswith("usr/share/doc/") and len(parts) == 4 and parts[3] == "copyright")


def unpack_debs(debs: Sequence[Path], rootfs: Path) -> list[str]:
    """Unpack every package's files (no maintainer scripts); return their control stanzas."""
    stanzas = []
    for deb in debs:
        stanzas.append(_run(["dpkg-deb", "--field", str(deb)]).stdout.strip())
        with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    name = member.name.removeprefix("./").rstrip("/")
                    if not name or _excluded(name + ("/" if member.isdir() else "")):
                        continue
                    target = rootfs / name
                    if (member.isfile() or member.issym() or member.islnk()) and target.is_symlink():
                        target.unlink()
                    member.name = name
                    if member.islnk():
                        member.linkname = member.linkname.removeprefix("./")
                    tar.extract(member, rootfs, filter="tar")
        if proc.returncode != 0:
            raise BuildError(f"dpkg-deb --fsys-tarfile {deb} failed")
    return stanzas


def write_system_files(rootfs: Path, stanzas: Sequence[str]) -> None:
    """What maintainer scripts and useradd would have made, made deterministically."""
    etc = rootfs / "etc"
    (etc / "passwd").write_text("root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                f"kai-es:x:{USER_ID}:{USER_ID}::/nonexistent:/usr/sbin/nologin\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nkai-es:x:{USER_ID}:\nnogroup:x:65534:\n")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nshadow: files\n"
                                       "hosts: files dns\nnetworks: files\nprotocols: files\n"
                                       "services: files\n")
    # update-ca-certificates' bundle: every certificate ca-certificates ships, in name order
    certs = sorted((rootfs / "usr/share/ca-certificates").rglob("*.crt"))
    if not certs:
        raise BuildError("ca-certificates shipped no certificate")
    bundle = b"".join(c.read_bytes().rstrip(b"\n") + b"\n" for c in certs)
    (etc / "ssl" / "certs").mkdir(parents=True, exist_ok=True)
    (etc / "ssl" / "certs" / "ca-certificates.crt").write_bytes(bundle)
    status = rootfs / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True, exist_ok=True)
    entries = sorted(stanzas, key=lambda s: s.split("\n", 1)[0])
    status.write_text("".join(_with_status(s) + "\n\n" for s in entries))
    tmp = rootfs / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    for d in ("proc", "sys", "dev", "run"):
        (rootfs / d).mkdir(exist_ok=True)


def _with_status(stanza: str) -> str:
    lines = stanza.split("\n")
    return "\n".join([lines[0], "Status: install ok installed", *lines[1:]])


def install_wheel(wheel: Path, rootfs: Path) -> None:
    """What `pip install --no-deps` does with a wheel, without pip: its files into
    SITE_PACKAGES (a `.data/scripts` file into SCRIPTS), a script per console_scripts entry
    point, INSTALLER and a RECORD of what was written."""
    site, scripts = rootfs / SITE_PACKAGES, rootfs / SCRIPTS
    written: list[Path] = []
    with zipfile.ZipFile(wheel) as z:
        dist_info = next(n.split("/")[0] for n in z.namelist() if n.split("/")[0].endswith(".dist-info"))
        data_dir = dist_info.removesuffix(".dist-info") + ".data"
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            name, blob = info.filename, z.read(info)
            mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            if name.startswith(data_dir + "/"):
                kind, _, rest = name[len(data_dir) + 1:].partition("/")
                if kind in ("purelib", "platlib"):
                    target = site / rest
                elif kind == "scripts":
                    target, mode = scripts / rest, 0o755
                    if blob.startswith(b"#!python"):
                        blob = b"#!" + PYTHON.encode() + blob[len(b"#!python"):]
                elif kind == "data":
                    target = rootfs / "usr/local" / rest
                else:  # headers: not needed at run time
                    continue
            elif name == f"{dist_info}/RECORD":
                continue
            else:
                target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob)
            target.chmod(mode)
            written.append(target)
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode() if f"{dist_info}/entry_points.txt" in z.namelist() else ""
    section = ""
    for line in entry_points.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "console_scripts" and "=" in line:
            script, _, ref = (s.strip() for s in line.partition("="))
            module, _, func = ref.partition(":")
            target = scripts / script
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"#!{PYTHON}\nimport sys\nfrom {module} import {func.split('.')[0]}\n"
                              f"if __name__ == '__main__':\n    sys.exit({func}())\n")
            target.chmod(0o755)
            written.append(target)
    (site / dist_info / "INSTALLER").write_text("kai-es tools/build_image.py\n")
    written.append(site / dist_info / "INSTALLER")
    record = []
    for path in sorted(written):
        data = path.read_bytes()
        digest = hashlib.sha256(data).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{os.path.relpath(path, site)},sha256={b64},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    (site / dist_info / "RECORD").write_text("\n".join(record) + "\n")


def _chroot_python(rootfs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The image's own interpreter, run on the rootfs (chroot: root, or a user namespace)."""
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    prefix = [chroot] if os.geteuid() == 0 else [shutil.which("unshare") or "unshare", "--map-root-user", chroot]
    env = {"PATH": ENV["PATH"], "PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": str(source_date_epoch())}
    return _run([*prefix, str(rootfs), PYTHON, *args], env=env)


def compile_bytecode(rootfs: Path, *dirs: str) -> None:
    """Hash-checked .pyc (no file time inside), by the image's interpreter, hash seed fixed."""
    _chroot_python(rootfs, "-m", "compileall", "-q", "-q", "--invalidation-mode", "checked-hash",
                   *(f"/{d}" for d in dirs))


def check_runtime(rootfs: Path) -> str:
    """Fail the build, not the first pod: the entry point answers and the native modules load."""
    out = _chroot_python(rootfs, "-c", "import kai_es._native._packer, kai_es._native._framing; "
                                       "import kai_es.cli, importlib.metadata as m; print(m.version('kai-es'))")
    for forbidden in ("usr/bin/gcc", "usr/bin/cc", "usr/bin/pip", "usr/bin/pip3", f"{SCRIPTS}/pip",
                      f"{SITE_PACKAGES}/pip", "usr/lib/python3/dist-packages/pip"):
        if (rootfs / forbidden).exists() or (rootfs / forbidden).is_symlink():
            raise BuildError(f"/{forbidden} must not be in the image")
    return out.stdout.strip()


# ---------------------------------------------------------------------------------------------
# Layers and the OCI layout


class _HashingWriter(io.RawIOBase):
    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h, self.size = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.f.write(data)
        self.h.update(data)
        self.size += len(data)
        return len(data)


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>"
    size: int
    path: Path


@dataclass(frozen=True)
class Layer:
    blob: Blob
    diff_id: str
    uncompressed_size: int


def _in_app_layer(rel: str) -> bool:
    return rel == APP_PREFIX or rel.startswith(APP_PREFIX + "/")


def _walk(rootfs: Path, include: Callable[[str], bool]) -> list[str]:
    names = []
    for dirpath, dirnames, filenames in os.walk(rootfs):
        rel_dir = os.path.relpath(dirpath, rootfs)
        for n in dirnames + filenames:
            rel = n if rel_dir == "." else f"{rel_dir}/{n}"
            if include(rel):
                names.append(rel)
    return sorted(names)


def write_layer(rootfs: Path, names: Sequence[str], blobs: Path, mtime: int) -> Layer:
    """A gzip'd tar of `names` (sorted) with fixed times and owners: the same files make the
    same bytes."""
    raw = blobs / "layer.tmp.tar"
    with open(raw, "wb") as f:
        tee = _HashingWriter(f)
        with tarfile.open(fileobj=tee, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            inodes: dict[tuple[int, int], str] = {}
            for name in names:
                path = rootfs / name
                st = path.lstat()
                info = tarfile.TarInfo(name)
                info.mode = st.st_mode & 0o7777
                info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
                key = (st.st_dev, st.st_ino)
                if path.is_symlink():
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
                    tar.addfile(info)
                elif path.is_dir():
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif path.is_file():
                    if st.st_nlink > 1 and key in inodes:
                        info.type, info.linkname = tarfile.LNKTYPE, inodes[key]
                        tar.addfile(info)
                        continue
                    inodes[key] = name
                    info.size = st.st_size
                    with open(path, "rb") as src:
                        tar.addfile(info, src)
                else:
                    raise BuildError(f"/{name}: not a file, directory or symlink")
    diff_id, raw_size = "sha256:" + tee.h.hexdigest(), tee.size
    blob = _gzip_blob(raw, blobs)
    raw.unlink()
    return Layer(blob, diff_id, raw_size)


def _gzip_blob(raw: Path, blobs: Path) -> Blob:
    tmp = blobs / "blob.tmp"
    with open(tmp, "wb") as f:
        tee = _HashingWriter(f)
        with gzip.GzipFile(filename="", mode="wb", fileobj=tee, compresslevel=6, mtime=0) as gz, open(raw, "rb") as src:
            shutil.copyfileobj(src, gz, 1 << 20)
    digest = tee.h.hexdigest()
    path = blobs / digest
    tmp.replace(path)
    return Blob(f"sha256:{digest}", tee.size, path)


def _json_blob(value: Any, blobs: Path) -> Blob:
    data = canonical_json(value)
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return Blob(f"sha256:{digest}", len(data), blobs / digest)


def _descriptor(media_type: str, blob: Blob, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": blob.digest, "size": blob.size, **extra}


@dataclass(frozen=True)
class Image:
    digest: str  # the manifest's
    tag: str
    layout: Path
    archive: Path
    size: int  # uncompressed layers, what `docker images` shows
    compressed_size: int
    layers: tuple[Layer, ...]
    config: dict[str, Any]


def write_layout(out: Path, layers: Sequence[Layer], config: dict[str, Any], tag: str) -> tuple[str, Path]:
    """Config, manifest, index.json, oci-layout under out/LAYOUT_DIR (layer blobs already in
    its blobs/sha256); return the manifest digest and the index path."""
    layout = out / LAYOUT_DIR
    blobs = layout / "blobs" / "sha256"
    config_blob = _json_blob(config, blobs)
    manifest = {
        "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
        "config": _descriptor(MEDIA_CONFIG, config_blob),
        "layers": [_descriptor(MEDIA_LAYER, layer.blob) for layer in layers],
    }  # fmt: skip
    manifest_blob = _json_blob(manifest, blobs)
    ref = tag.rsplit(":", 1)[1] if ":" in tag.rsplit("/", 1)[-1] else "latest"
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [_descriptor(MEDIA_MANIFEST, manifest_blob, annotations={
                 "io.containerd.image.name": tag, "org.opencontainers.image.ref.name": ref})]}
    (layout / "index.json").write_bytes(canonical_json(index))
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    # `docker load` reads manifest.json (docker save writes it next to the OCI files)
    (layout / "manifest.json").write_bytes(canonical_json([{
        "Config": f"blobs/sha256/{config_blob.digest.split(':')[1]}", "RepoTags": [tag],
        "Layers": [f"blobs/sha256/{layer.blob.digest.split(':')[1]}" for layer in layers]}]))
    return manifest_blob.digest, layout / "index.json"


def write_archive(layout: Path, archive: Path, mtime: int) -> None:
    """The layout as one tar (sorted, fixed times): what `ctr images import` and `docker load` read."""
    names = _walk(layout, lambda rel: True)
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(layout / name), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isfile():
                with open(layout / name, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    tmp.replace(archive)


def image_config(layers: Sequence[Layer], created: str, version: str, rev: str,
                 packages: Sequence[DebPackage]) -> dict[str, Any]:
    deb_digest = hashlib.sha256(DEBIAN_LOCK.read_bytes()).hexdigest()
    return {
        "architecture": "amd64", "os": "linux", "created": created,
        "config": {
            "User": f"{USER_ID}:{USER_ID}", "Env": [f"{k}={v}" for k, v in ENV.items()],
            "Entrypoint": ENTRYPOINT, "Cmd": CMD, "WorkingDir": WORKDIR,
            "Labels": {
                "org.opencontainers.image.title": "kai-es",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.revision": rev,
                "org.opencontainers.image.created": created,
                "org.opencontainers.image.licenses": "Apache-2.0",
                "org.opencontainers.image.base.name": f"debian:{DEBIAN_SUITE} ({len(packages)} packages, "
                                                      f"deploy/image/debian.lock sha256 {deb_digest[:16]})",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [
            {"created": created, "created_by": f"tools/build_image.py: Debian {DEBIAN_SUITE} packages "
                                               "(deploy/image/debian.lock), system files, stdlib bytecode"},
            {"created": created, "created_by": "tools/build_image.py: kai-es wheel + deploy/image/requirements.lock "
                                               f"into /{SITE_PACKAGES}, bytecode"},
        ],
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The whole build


def _prepare_out(out: Path) -> None:
    """`out` must be absent, empty or ours: never overwrite what this tool did not make."""
    if out.exists():
        if not out.is_dir():
            raise BuildError(f"{out} exists and is not a directory this tool made: choose another --out")
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise BuildError(f"{out} is not empty and was not made by tools/build_image.py "
                             f"(no {MARKER}): choose another --out")
        for child in out.iterdir():
            if child.name in (LAYOUT_DIR, ARCHIVE, MARKER):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            else:
                raise BuildError(f"{child} was not made by tools/build_image.py: move it away first")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by tools/build_image.py: rebuilt in place by it\n")


@contextlib.contextmanager
def _work_dir() -> Iterator[Path]:
    base = cache_root() / "work"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="build-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build(out: Path, tag: str | None = None, log: Any = None) -> Image:
    def say(msg: str) -> None:
        if log is not None:
            log(msg)

    version = str(_pyproject()["project"]["version"])
    tag = tag or f"{DEFAULT_TAG_REPO}:{version}"
    epoch = source_date_epoch()
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    packages = read_debian_lock()
    t0 = time.monotonic()
    debs = fetch_debs(packages)
    wheels = fetch_wheels()
    say(f"fetched {len(debs)} .debs, {len(wheels)} wheels ({time.monotonic() - t0:.1f}s)")
    _prepare_out(out)
    with _work_dir() as work:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        stanzas = unpack_debs(debs, rootfs)
        write_system_files(rootfs, stanzas)
        compile_bytecode(rootfs, "usr/lib/python3.11")
        say(f"base rootfs ({time.monotonic() - t0:.1f}s)")
        kai_wheel = build_wheel(work)
        say(f"built {kai_wheel.name} ({time.monotonic() - t0:.1f}s)")
        for wheel in [*wheels, kai_wheel]:
            install_wheel(wheel, rootfs)
        for alias in ("python3", "python"):
            (rootfs / SCRIPTS / alias).symlink_to(PYTHON)
        compile_bytecode(rootfs, SITE_PACKAGES)
        installed = check_runtime(rootfs)
        if installed != version:
            raise BuildError(f"the image's kai-es is {installed!r}, pyproject says {version!r}")
        say(f"app installed ({time.monotonic() - t0:.1f}s)")
        blobs = out / LAYOUT_DIR / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        layers = (write_layer(rootfs, _walk(rootfs, lambda rel: not _in_app_layer(rel)), blobs, epoch),
                  write_layer(rootfs, _walk(rootfs, _in_app_layer), blobs, epoch))
        say(f"layers written ({time.monotonic() - t0:.1f}s)")
    config = image_config(layers, created, version, revision(), packages)
    digest, _ = write_layout(out, layers, config, tag)
    write_archive(out / LAYOUT_DIR, out / ARCHIVE, epoch)
    say(f"archive written ({time.monotonic() - t0:.1f}s)")
    return Image(digest, tag, out / LAYOUT_DIR, out / ARCHIVE,
                 sum(layer.uncompressed_size for layer in layers),
                 sum(layer.blob.size for layer in layers), layers, config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the image into --out (an OCI layout and an archive)")
    b.add_argument("--out", type=Path, default=ROOT / "build" / "image")
    b.add_argument("--tag", help=f"image name (default {DEFAULT_TAG_REPO}:<version>)")
    b.add_argument("--quiet", action="store_true")
    sub.add_parser("fetch", help="download the locked .debs and wheels into the cache")
    sub.add_parser("lock", help="re-resolve deploy/image/*.lock from apt's lists and PyPI")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            pkgs = lock_debian()
            lock_python()
            print(f"locked {len(pkgs)} Debian packages and the wheels into {LOCK_DIR.relative_to(ROOT)}/")
        elif args.command == "fetch":
            debs, wheels = fetch_debs(read_debian_lock()), fetch_wheels()
            build_env()
            print(f"cached {len(debs)} .debs and {len(wheels)} wheels under {cache_root()}")
        else:
            t0 = time.monotonic()
            image = build(args.out.resolve(), args.tag,
                          log=None if args.quiet else lambda m: print(m, file=sys.stderr))
            print(f"digest={image.digest}")
            print(f"tag={image.tag}")
            print(f"size={image.size} ({image.size / 1e6:.1f} MB uncompressed, "
                  f"{image.compressed_size / 1e6:.1f} MB compressed)")
            print(f"layout={image.layout}")
            print(f"archive={image.archive}")
            print(f"seconds={time.monotonic() - t0:.1f}")
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
