# Sourced by the scripts/device_*.sh runners on a GPU machine, from the repository root: installs the wheels
# carried in `.whl` (the packages the machine's image lacks, docs/benchmarks/gpu.md) into /tmp/site and puts
# them, the tree's services (or $SRC) and the root on PYTHONPATH; NVLink multicast stays off for NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
fi
export PYTHONPATH="/tmp/site:${SRC:-$PWD/services}:$PWD"
# The device returns at most 8 files from $OUT: `bundle DIR` packs everything under DIR into DIR/all.tgz and
# leaves only that and DIR's top-level *.log files, so the summary reads without unpacking.
bundle() {
  local dir="${1%/}"
  [ -d "$dir" ] || return 0
  tar czf /tmp/bundle.tgz -C "$dir" . && mv /tmp/bundle.tgz "$dir/all.tgz" || return 1
  find "$dir" -type f ! -path "$dir/all.tgz" ! -regex "$dir/[^/]*\.log" -delete
  find "$dir" -mindepth 1 -type d -empty -delete
}
