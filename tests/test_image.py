"""The kai-es image (tools/build_image.py): built twice from this checkout, same digest; under
250 MB; no compiler, no pip; run under runc with the chart's security context (uid 10001, a
read-only root, no capabilities, no new privileges, a tmpfs /tmp like the chart's emptyDir);
imported into containerd and run there. Needs root (chroot, runc, containerd) and Debian's runc
and containerd (.ci/run installs them): without them these tests fail, they never skip."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import load_tool_module

ROOT = Path(__file__).resolve().parents[1]
img: Any = load_tool_module("kai_es_tools_build_image", ROOT / "tools" / "build_image.py")
VALUES = yaml.safe_load((ROOT / "deploy" / "helm" / "kai-es" / "values.yaml").read_text())
SIZE_LIMIT = 250_000_000


def test_the_dockerfile_describes_the_same_image() -> None:
    """Both recipes say the same user, entrypoint, command, workdir and Python settings, and
    name each other."""
    docker = (ROOT / "deploy" / "Dockerfile").read_text()
    uid = VALUES["podSecurityContext"]["runAsUser"]
    assert img.USER_ID == uid == VALUES["podSecurityContext"]["runAsGroup"]
    assert f"USER {uid}:{uid}" in docker
    assert f"WORKDIR {img.WORKDIR}" in docker
    assert f"ENTRYPOINT {json.dumps(img.ENTRYPOINT)}" in docker
    assert f"CMD {json.dumps(img.CMD)}" in docker
    for key in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"):
        assert re.search(rf"\b{key}={img.ENV[key]}\b", docker), key
    assert "tools/build_image.py" in docker and "deploy/Dockerfile" in (img.__doc__ or "")
    assert "[plots]" not in docker  # the image leaves matplotlib out, both ways


@dataclass
class Built:
    first: Any  # tools/build_image.py Image
    second: Any
    rootfs: Path
    work: Path


def _unpack(layout: Path, rootfs: Path) -> None:
    """The image's layers applied in order with plain tar, as a runtime would (no whiteouts in it)."""
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_text())
    rootfs.mkdir()
    for layer in manifest["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        subprocess.run(["tar", "-xzf", str(blobs / layer["digest"].split(":")[1]), "-C", str(rootfs),
                        "--same-owner", "--same-permissions"], check=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, kai_es_image: Any) -> Iterator[Built]:
    work = tmp_path_factory.mktemp("image")
    first = kai_es_image  # the session's build (tests/conftest.py), shared with the on-node test
    second = img.build(work / "b")
    _unpack(first.layout, work / "rootfs")
    yield Built(first, second, work / "rootfs", work)


@pytest.mark.slow
def test_two_builds_give_the_same_digest(built: Built) -> None:
    a, b = built.first, built.second
    assert a.digest == b.digest, (a.digest, b.digest)
    assert [layer.diff_id for layer in a.layers] == [layer.diff_id for layer in b.layers]
    assert a.archive.read_bytes() == b.archive.read_bytes()
    print(f"digest {a.digest}")


@pytest.mark.slow
def test_the_image_is_under_250_mb(built: Built) -> None:
    image = built.first
    print(f"size {image.size / 1e6:.1f} MB uncompressed, {image.compressed_size / 1e6:.1f} MB compressed")
    on_disk = sum(p.lstat().st_size for p in built.rootfs.rglob("*") if p.is_file() and not p.is_symlink())
    assert image.size < SIZE_LIMIT and on_disk < SIZE_LIMIT, (image.size, on_disk)


@pytest.mark.slow
def test_the_image_has_no_compiler_and_no_pip(built: Built) -> None:
    files = [p for p in built.rootfs.rglob("*") if not p.is_dir()]
    programs = {p.name for p in files if p.is_symlink() or os.access(p, os.X_OK)}
    for tool in ("gcc", "cc", "c++", "g++", "cpp", "ld", "as", "make", "pip", "pip3", "pip3.11", "apt", "apt-get"):
        assert tool not in programs, tool
    assert not [n for n in programs if re.fullmatch(r"(x86_64-linux-gnu-)?(gcc|g\+\+|cc1.*|ld\..*)(-\d+)?", n)]
    # no pip (nor ensurepip, which would bring it back) as a module anywhere
    packages = {p.parent.name for p in files if p.name == "__init__.py"}
    assert not {"pip", "ensurepip", "setuptools"} & packages, {"pip", "ensurepip", "setuptools"} & packages
    # the wheel's compiled modules are there, the sources the build generated are not needed
    native = built.rootfs / img.SITE_PACKAGES / "kai_es" / "_native"
    assert list(native.glob("_packer*.so")) and list(native.glob("_framing*.so"))


@pytest.mark.slow
def test_the_config_is_the_charts_runtime_user(built: Built) -> None:
    config = built.first.config["config"]
    user, group = (int(x) for x in config["User"].split(":"))  # numeric: runAsNonRoot can check it
    assert user == group == VALUES["podSecurityContext"]["runAsUser"] != 0
    assert config["Entrypoint"] == ["kai-es"] and config["WorkingDir"] == "/tmp"
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", config["Labels"]["org.opencontainers.image.revision"])


# --- runc ----------------------------------------------------------------------------------------


def _bundle_config(built: Built, args: list[str]) -> dict[str, Any]:
    """`runc spec` made into the chart's container: its podSecurityContext and securityContext
    (values.yaml) and its /tmp emptyDir, with the image's Env and WorkingDir."""
    pod, container = VALUES["podSecurityContext"], VALUES["securityContext"]
    spec_dir = built.work / f"spec-{uuid.uuid4().hex[:8]}"
    spec_dir.mkdir()
    subprocess.run(["runc", "spec", "--bundle", str(spec_dir)], check=True)
    config: dict[str, Any] = json.loads((spec_dir / "config.json").read_text())
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    process = config["process"]
    process.update(terminal=False, args=args, cwd=built.first.config["config"]["WorkingDir"],
                   env=built.first.config["config"]["Env"],
                   user={"uid": pod["runAsUser"], "gid": pod["runAsGroup"]},
                   noNewPrivileges=container["allowPrivilegeEscalation"] is False)
    assert container["capabilities"]["drop"] == ["ALL"] and not container["capabilities"].get("add")
    process["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    config["root"] = {"path": str(built.rootfs), "readonly": container["readOnlyRootFilesystem"] is True}
    config["hostname"] = "kai-es"
    config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                             "options": ["nosuid", "nodev", "mode=1777", "size=64m"]})
    (spec_dir / "config.json").write_text(json.dumps(config))
    return {"dir": spec_dir, "config": config}


def runc(built: Built, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed (Debian package runc; .ci/run installs it)")
    bundle = _bundle_config(built, list(args))
    res = subprocess.run(["runc", "--root", str(built.work / "runc-state"), "run", "--bundle", str(bundle["dir"]),
                          f"kai-es-image-test-{uuid.uuid4().hex[:12]}"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if ok:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.mark.slow
def test_kai_es_version_under_runc(built: Built) -> None:
    assert runc(built, "kai-es", "--version").stdout.strip() == "kai-es, version 0.1.0"


@pytest.mark.slow
def test_scheduler_help_under_runc(built: Built) -> None:
    out = runc(built, "kai-es", "scheduler", "--help").stdout
    assert out.startswith("Usage: kai-es scheduler [OPTIONS]") and "--period" in out, out


@pytest.mark.slow
def test_the_native_packer_loads_in_the_image(built: Built) -> None:
    code = ("import kai_es._native._packer as p, kai_es._native._framing as f\n"
            "from kai_es.scheduling.packing import load_packer\n"
            "print(p.__file__, f.__file__, type(load_packer('native')).__name__)")
    out = runc(built, "python", "-c", code).stdout.split()
    assert out[0].startswith(f"/{img.SITE_PACKAGES}/kai_es/_native/_packer") and out[0].endswith(".so")
    assert out[2] == "NativePacker", out


@pytest.mark.slow
def test_the_security_context_holds_inside(built: Built) -> None:
    """uid/gid 10001, no capability in any set, no new privileges; the root is read-only,
    /tmp (the emptyDir) is writable."""
    code = """
import os, errno
print(os.getuid(), os.getgid(), os.geteuid())
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
print(*(status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")))
mounts = {l.split()[4]: (l.split()[5].split(","), l.split(" - ")[1].split()[0]) for l in open("/proc/self/mountinfo")}
print(mounts["/"][0][0], mounts["/tmp"][0][0], mounts["/tmp"][1])
for path in ("/x", "/usr/local/lib/x"):
    try:
        open(path, "a").close(); print("wrote", path)
    except OSError as e:
        print(errno.errorcode[e.errno])
open("/tmp/ok", "w").write("ok"); print(open("/tmp/ok").read())
"""
    lines = runc(built, "python", "-c", code).stdout.splitlines()
    uid = VALUES["podSecurityContext"]["runAsUser"]
    assert lines[0] == f"{uid} {uid} {uid}"
    assert lines[1] == " ".join(["0000000000000000"] * 5 + ["1"])
    assert lines[2] == "ro rw tmpfs"  # the root mount is read-only, /tmp a writable tmpfs
    assert lines[3:5] == ["EROFS", "EROFS"]  # not a permission error: the file system refuses
    assert lines[5] == "ok"


@pytest.mark.slow
def test_the_ca_bundle_and_the_missing_plots_are_what_the_image_promises(built: Built) -> None:
    certs = runc(built, "python", "-c", "import ssl; print(len(ssl.create_default_context().get_ca_certs()))")
    assert int(certs.stdout) > 100  # Debian's ca-certificates, as update-ca-certificates bundles them
    res = runc(built, "kai-es", "simulate", "/nonexistent.yaml", ok=False)
    assert res.returncode == 2 and "pip install 'kai-es[plots]'" in res.stderr, res.stderr


# --- containerd ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_containerd_imports_and_runs_the_archive(built: Built) -> None:
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.fail("containerd is not installed (Debian package containerd; .ci/run installs it)")
    d = built.work / "containerd"
    d.mkdir()
    sock = d / "containerd.sock"
    (d / "config.toml").write_text(f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
""")
    log = open(d / "containerd.log", "wb")
    proc = subprocess.Popen(["containerd", "--config", str(d / "config.toml")], stdout=log, stderr=log)

    def ctr(*args: str, timeout: float = 120) -> str:
        res = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", *args],
                             capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, f"ctr {args}: {res.stdout}{res.stderr}\n{(d / 'containerd.log').read_text()[-2000:]}"
        return res.stdout

    try:
        for _ in range(100):
            if sock.exists() and subprocess.run(["ctr", "--address", str(sock), "version"],
                                                capture_output=True).returncode == 0:
                break
            assert proc.poll() is None, (d / "containerd.log").read_text()[-2000:]
            time.sleep(0.1)
        ctr("images", "import", str(built.first.archive))
        listed = {line.split()[0]: line.split()[2] for line in ctr("images", "ls").splitlines()[1:]}
        assert listed.get(built.first.tag) == built.first.digest, listed
        # containerd takes the user, entrypoint, command and workdir from the image's config
        out = ctr("run", "--rm", "--read-only", "--mount", "type=tmpfs,src=tmpfs,dst=/tmp,options=nosuid:nodev",
                  built.first.tag, "kai-es-image-test")
        assert out.startswith("Usage: kai-es [OPTIONS] COMMAND"), out
        who = ctr("run", "--rm", "--read-only", built.first.tag, "kai-es-image-test-2",
                  "python", "-c", "import os; print(os.getuid(), os.getcwd())")
        assert who.split() == [str(img.USER_ID), "/tmp"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["umount", "-R", str(d / "root")], capture_output=True)
