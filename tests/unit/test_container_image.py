"""deployments/kuberay/Dockerfile builds the image rayservice.yaml runs (no Docker needed: the
file is read here and checked against pyproject.toml, the manifest and docs/operating.md)."""

from __future__ import annotations

import re
import shlex
import tomllib
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).parents[2]
DOCKERFILE = REPO / "deployments" / "kuberay" / "Dockerfile"
MANIFEST = REPO / "deployments" / "kuberay" / "rayservice.yaml"
BASE = re.compile(r"rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-py(?P<py>3\d+)-cu(?P<cuda>\d+)")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined; comment lines inside a continued
    instruction are dropped, as Docker drops them."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        op, _, args = (pending + line).partition(" ")
        out.append((op.upper(), args.strip()))
        pending = ""
    assert not pending, "the file ends inside a continued instruction"
    return out


def _expand(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in env, f"${name} is not set at this point of the Dockerfile"
        return env[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def _stage(text: str | None = None) -> dict[str, Any]:
    """The single stage as a build sees it: ARGs before FROM are only visible to FROM and to
    an ARG of the same name redeclared after it."""
    global_args: dict[str, str] = {}
    env: dict[str, str] = {}
    stage: dict[str, Any] = {"from": None, "copies": [], "runs": [], "users": [], "env": env}
    for op, args in _instructions(DOCKERFILE.read_text() if text is None else text):
        if op == "ARG":
            name, eq, default = args.partition("=")
            scope = global_args if stage["from"] is None else env
            if eq:
                scope[name] = _expand(default, env if scope is env else global_args)
            elif stage["from"] is not None and name in global_args:
                env[name] = global_args[name]
        elif op == "FROM":
            assert stage["from"] is None, "one stage expected"
            stage["from"] = _expand(args, global_args)
        elif op == "ENV":
            name, _, value = args.partition("=")
            env[name] = _expand(value, env)
        elif op == "COPY":
            words = shlex.split(args)
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            stage["copies"].append((flags, paths[:-1], paths[-1]))
        elif op == "RUN":
            stage["runs"].append(_expand(args, env))
        elif op == "USER":
            stage["users"].append(_expand(args, env))
    assert stage["from"] is not None
    return stage


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def _pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = doc["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])]


def _pip_install(stage: dict[str, Any]) -> list[str]:
    (run,) = [r for r in stage["runs"] if re.search(r"\bpip install\b", r)]
    command = shlex.split(run.split("&&")[0])
    return [w for w in command[command.index("install") + 1:] if not w.startswith("-")]


def _gpu_extra(stage: dict[str, Any]) -> tuple[str, str]:
    """(source directory, extra) of the project's own requirement in the pip install."""
    own = [w for w in _pip_install(stage) if w.startswith("/")]
    assert len(own) == 1, f"one install of the project from the copied tree: {own}"
    m = re.fullmatch(r"(?P<src>/[^\[]+)\[(?P<extra>[\w-]+)\]", own[0])
    assert m, own[0]
    return m["src"], m["extra"]


def test_the_base_image_is_rays_own_of_the_release_the_project_and_the_manifest_name() -> None:
    stage = _stage()
    base = BASE.fullmatch(stage["from"])
    assert base, stage["from"]
    ray = base["ray"]
    assert ray == _manifest()["spec"]["rayClusterConfig"]["rayVersion"]
    project = _pyproject()["project"]
    (pin,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "ray"]
    assert Version(ray) in pin.specifier, (ray, str(pin))
    python = f"{base['py'][0]}.{base['py'][1:]}"
    assert Version(python) in SpecifierSet(project["requires-python"]), python
    # pip must keep the base image's Ray: the install pins it to that very release
    named = [Requirement(w) for w in _pip_install(stage) if not w.startswith("/")]
    pinned = [r for r in named if r.name == "ray"]
    assert [(str(r.specifier), "serve" in r.extras) for r in pinned] == [(f"=={ray}", True)]


def test_it_installs_the_project_with_a_gpu_extra_of_the_base_images_cuda() -> None:
    stage = _stage()
    src, extra = _gpu_extra(stage)
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extra in extras, f"pyproject defines no extra {extra!r}"
    (cupy,) = [Requirement(r) for r in extras[extra] if r.startswith("cupy")]
    cuda_major = re.fullmatch(r"cupy-cuda(\d+)x", cupy.name)
    assert cuda_major, cupy.name
    base = BASE.fullmatch(stage["from"])
    assert base and base["cuda"].startswith(cuda_major.group(1)), (stage["from"], cupy.name)
    assert src.startswith("/")


def test_every_copied_path_exists_is_in_the_context_and_the_wheel_has_its_sources() -> None:
    stage = _stage()
    src, _ = _gpu_extra(stage)
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"

    def ignored(rel: str) -> bool:
        parts = PurePosixPath(rel).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for p in (p.strip("/") for p in patterns):
            for pre in prefixes:
                if fnmatch(pre, p) or (p.startswith("**/") and fnmatch(pre.split("/")[-1], p[3:])):
                    return True
        return False

    copied: dict[PurePosixPath, str] = {}  # where in the image -> what from the context
    for flags, sources, dest in stage["copies"]:
        assert not any(f.startswith("--from") for f in flags)
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such path"
            assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
            into = PurePosixPath(dest) / source if dest.endswith("/") else PurePosixPath(dest)
            copied[into] = source
    in_src = {str(p.relative_to(src)): s for p, s in copied.items() if p.is_relative_to(src)}
    assert in_src.get("pyproject.toml") == "pyproject.toml"
    project = _pyproject()
    readme = project["project"]["readme"]
    assert in_src.get(readme) == readme, "the wheel's metadata reads the README"
    for package in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        name = package.rstrip("*")
        assert in_src.get(name) == name, f"package {name} is not copied"
    for package in project["tool"]["setuptools"].get("package-data", {}):
        assert package in in_src, package
    # nothing the install needs is excluded from the context
    for path in ("pyproject.toml", readme, "morphogen/engine/scan_kernel.cu"):
        assert not ignored(path), path


def test_the_cache_directory_is_the_manifests_and_the_user_owns_it() -> None:
    stage = _stage()
    doc = _manifest()
    (app,) = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
    cache = PurePosixPath(app["args"]["snapshot_cache_dir"]).parent
    assert stage["env"].get("MORPHOGEN_CACHE_DIR") == str(cache)
    for pod in _pods(doc):
        for container in pod["containers"]:
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert str(cache) in mounts, container["name"]
    uid = stage["users"][-1]
    made = [r for r in stage["runs"] if re.search(rf"\bmkdir -p \"?{re.escape(str(cache))}\b", r)]
    assert made, f"{cache} is not created"
    assert any(re.search(rf"\bchown {uid}(:\d+)? \"?{re.escape(str(cache))}\b", r)
               for r in made), f"{cache} is not given to uid {uid}"


def test_it_runs_as_the_non_root_uid_the_pods_run_as() -> None:
    stage = _stage()
    user = stage["users"][-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {user}: runAsNonRoot needs a numeric uid"
    for pod in _pods(_manifest()):
        assert pod["securityContext"]["runAsUser"] == int(uid)
    # what it builds from belongs to that user (setuptools writes in the source tree)
    for flags, _, _ in stage["copies"]:
        assert any(f.startswith(f"--chown={uid}") for f in flags), flags


def test_the_manifest_and_the_book_name_the_image_this_file_builds() -> None:
    """The tag is the project's version and the CUDA major of the extra installed; the book's
    KubeRay steps (docs/operating.md) build and push the very name the manifest pulls, under
    the operator's registry."""
    stage = _stage()
    _, extra = _gpu_extra(stage)
    cuda = re.search(r"cuda\d+", extra)
    assert cuda, extra
    version = _pyproject()["project"]["version"]
    images = {c["image"] for pod in _pods(_manifest()) for c in pod["containers"]}
    assert len(images) == 1, images
    (image,) = images
    name = image.rsplit("/", 1)[-1]
    assert name == f"morphogen:{version}-{cuda.group(0)}", image
    steps = (REPO / "docs" / "operating.md").read_text()
    rel = DOCKERFILE.relative_to(REPO).as_posix()
    build = re.search(rf"docker build -f {re.escape(rel)} -t \$REGISTRY/(\S+) \.\n", steps)
    assert build and build.group(1) == name, "docs/operating.md's build is not the manifest's image"
    assert f"docker push $REGISTRY/{name}\n" in steps


@pytest.mark.parametrize("text, expected", [
    ("ARG V=1\nFROM x:${V}\n", "x:1"),
    ("FROM x:1 \\\n  # inside a continuation\n  AS y\n", "x:1 AS y"),
])
def test_the_reader_of_this_file(text: str, expected: str) -> None:
    assert _stage(text)["from"] == expected


def test_the_reader_scopes_args_as_a_build_does() -> None:
    with pytest.raises(AssertionError, match="V is not set"):
        _stage("ARG V=1\nFROM x:${V}\nRUN echo $V\n")
    assert _stage("ARG V=1\nFROM x\nARG V\nRUN echo $V\n")["runs"] == ["echo 1"]
