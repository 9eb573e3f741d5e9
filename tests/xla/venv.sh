#!/usr/bin/env bash
# The virtual environment for the XLA tests (tests/e2e/test_xla.py): torch + torch_xla 2.9.0 and launch's own
# dependencies, outside the repository and reused between runs.
#
#   tests/xla/venv.sh          make it (once: about 4 GB of downloads and 7 GB on disk) and print its python
#   tests/xla/venv.sh --check  print its python if it is made; exit 1 if not
#
# It lives at $LAUNCH_XLA_VENV, by default ~/.cache/launch/xla-venv-<digest of what it holds>, so a change of
# pins or dependencies makes a new one. pip's machine-wide configuration is bypassed: it caps torch below
# what torch_xla needs and offers local wheels of other torch builds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}

requirements() {  # launch's runtime dependencies and the tpu extra, from pyproject.toml
    "$PYTHON" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["tpu"]))
PY
}

digest=$( { requirements; cat "$ROOT/tests/xla/constraints.txt"; } | sha256sum | cut -c1-12)
VENV=${LAUNCH_XLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/launch/xla-venv-$digest}

if [[ ${1:-} == --check ]]; then
    [[ -x $VENV/bin/python && -f $VENV/.complete ]] || exit 1
elif [[ ! -x $VENV/bin/python || ! -f $VENV/.complete ]]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    requirements >"$VENV/requirements.txt"
    env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$VENV/bin/pip" install -q -c "$ROOT/tests/xla/constraints.txt" -r "$VENV/requirements.txt" >&2
    touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
