#!/usr/bin/env bash
# A smaller wheel set for device calls whose working tree leaves too little of the 64 MiB carry for `.whl`:
# Ray without ray/rllib, ray/llm, ray/serve, ray/tune and ray/train (Laminar imports none of them), its four
# dependencies, crc32c and tensorboardX; gguf only with GGUF=1 (the SmolLM2 import). Written to .carry/wheels.
#   bash configs/slim-wheels.sh            # then carry [".carry/wheels"] and run with WHEELS=.carry/wheels
set -euo pipefail
src=${1:-.whl}; dst=.carry/wheels
rm -rf "$dst"; mkdir -p "$dst"
for w in "$src"/*.whl; do
  case "$(basename "$w")" in
    ray-*) ;;
    gguf-*) [ "${GGUF:-0}" = 1 ] && cp "$w" "$dst"/ ;;
    *) cp "$w" "$dst"/ ;;
  esac
done
python3 - "$src" "$dst" <<'PY'
import pathlib, re, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
drop = re.compile(r"^ray/(rllib|llm|serve|tune|train)/")
for whl in src.glob("ray-*.whl"):
    with zipfile.ZipFile(whl) as zi, zipfile.ZipFile(dst / whl.name, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zo:
        for info in zi.infolist():
            if drop.match(info.filename):
                continue
            data = zi.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                keep = [l for l in data.decode().splitlines() if not drop.match(l.split(",")[0])]
                data = ("\n".join(keep) + "\n").encode()
            zo.writestr(info, data)
PY
du -sh "$dst"
