#!/usr/bin/env bash
# The dependency floors, tested: installs exactly the lowest version pyproject.toml allows of
# every runtime, test and bench dependency (`name>=X` becomes `name==X`) into a fresh virtual
# environment, the project itself with --no-deps, then runs the unit tier. Dependencies of
# dependencies resolve as pip picks them. Not part of .ci/run (the installs alone take minutes);
# run it after changing a floor: `bash .ci/floors.sh` (PYTHON=python3.11 to pick the interpreter,
# KEEP=1 to keep the environment, extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

venv=$(mktemp -d /tmp/morphogen-floors.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$venv"' EXIT
"${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip

# The requirements (runtime, the test and bench extras) and a constraints file pinning each to
# its floor.
"$py" - "$venv" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
reqs = list(dict.fromkeys(project["dependencies"] + extras["test"] + extras["bench"]))
pins = {}
for req in reqs:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
    floor = re.search(r">=\s*([^,;\s]+)", req)
    if floor is None:
        sys.exit(f"{req!r} has no floor: every dependency states the oldest version it works with")
    pins[name.lower()] = f"{name}=={floor.group(1)}"
open(f"{sys.argv[1]}/requirements.txt", "w").write("\n".join(reqs) + "\n")
open(f"{sys.argv[1]}/constraints.txt", "w").write("\n".join(pins.values()) + "\n")
EOF
echo "== floors"
cat "$venv/constraints.txt"

# wheels only: a floor means a version that installs here as published, not one that builds
"$py" -m pip install --quiet --only-binary=:all: -r "$venv/requirements.txt" \
  -c "$venv/constraints.txt"
"$py" -m pip install --quiet --no-deps -e "$root"
"$py" -m pip check || true  # informative: a conflict among dependencies of dependencies

echo "== installed at the floors"
# every pinned name must have installed at exactly its floor
"$py" - "$venv/constraints.txt" <<'EOF'
import sys
from importlib.metadata import version
from packaging.version import Version
bad = []
for line in open(sys.argv[1]).read().split():
    name, want = line.split("==")
    got = version(name.split("[")[0])
    print(f"{name:<16} {got}")
    if Version(got) != Version(want):
        bad.append(f"{name} {got} (floor {want})")
if bad:
    sys.exit("not at the floor: " + ", ".join(bad))
EOF

echo "== unit tier"
# the environment's own packages only: no PYTHONPATH from the caller's shell
env -u PYTHONPATH "$py" -m pytest tests/unit -q -p no:cacheprovider "$@"
