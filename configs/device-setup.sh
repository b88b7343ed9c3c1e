#!/usr/bin/env bash
# What a lent GPU machine's image lacks, installed from the wheels carried in `${WHEELS:-.whl}` into /tmp/site;
# every device script runs this first and then puts /tmp/site on PYTHONPATH. `.whl` is made on a machine with
# PyPI access, as Python 3.12 x86_64 wheels (`pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 -d .whl ...`): ray==2.60.0 (its Java jars and JS source maps dropped) with
# jsonschema, jsonschema-specifications, referencing, rpds-py; crc32c (the relay's wire checksums),
# tensorboardX, gguf (the SmolLM2 import), pebble (the reward worker pool), and for the math reward math-verify,
# latex2sympy2_extended and antlr4-python3-runtime==4.13.2. The image has torch, transformers, numpy, yaml,
# matplotlib.
# The working tree and the carried wheels must fit 64 MiB together; when they do not, `bash
# configs/slim-wheels.sh` writes a smaller set to .carry/wheels (Ray without the libraries Laminar never
# imports, no gguf) and the device call carries that with WHEELS=.carry/wheels.
set -euo pipefail
[ -f /tmp/site/.laminar-setup-done ] && exit 0
wheels=${WHEELS:-.whl}
ls "$wheels"/*.whl > /dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/*.whl
touch /tmp/site/.laminar-setup-done
