#!/usr/bin/env bash
# What a lent GPU machine's image lacks (Ray and its few missing dependencies), installed from the wheels carried
# in `.whl` into /tmp/site; every device script runs this first and then puts /tmp/site on PYTHONPATH.
# `.whl` is made on a machine with PyPI access: Ray 2.60 and jsonschema, referencing, rpds-py as Python 3.12
# x86_64 wheels (`pip download --only-binary=:all: --python-version 3.12 ...`), with the Ray wheel's Java jars
# and JS source maps dropped to fit the 64 MiB a call may carry. Add a gguf wheel for the SmolLM2 import.
set -euo pipefail
[ -f /tmp/site/.laminar-setup-done ] && exit 0
ls .whl/*.whl > /dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
touch /tmp/site/.laminar-setup-done
