#!/usr/bin/env bash
# Build a TensorRT-LLM wheel at a release tag with the capacity-scheduler guard applied.
#
# Usage: build-trtllm-with-guard.sh TAG WHEEL_DIR [--install]
#   TAG        git tag of NVIDIA/TensorRT-LLM, e.g. v1.3.0rc29 (must match the runtime image)
#   WHEEL_DIR  where the built tensorrt_llm-*.whl is written
#   --install  also pip-install the wheel over the installed tensorrt_llm (no dependency changes)
#
# Environment:
#   TRTLLM_CUDA_ARCHS  CUDA architectures (default "90-real;100-real": Hopper and Blackwell).
#                      Fewer architectures build much faster.
#   TRTLLM_BUILD_JOBS  parallel compile jobs (default: all CPUs; each job may need ~4 GB RAM)
#   TRTLLM_SRC_DIR     checkout directory (default /tmp/TensorRT-LLM)
#   TRTLLM_GUARD_PATCH patch file (default: next to this script)
#
# Runs inside nvcr.io/nvidia/tensorrt-llm/devel:<version> (compilers, CUDA, TensorRT headers).
# A full build takes hours and tens of GB of disk: that is why the Docker build argument
# TRTLLM_SCHEDULER_GUARD defaults to 0.
set -euo pipefail

readonly REPO_URL="https://github.com/NVIDIA/TensorRT-LLM.git"
readonly SCHEDULER_FILE="cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp"
readonly EXPECTED_GUARDS=3

usage() {
    sed -n '3,8p' "$0" >&2
    exit 2
}

[[ $# -ge 2 ]] || usage
tag=$1
wheel_dir=$(mkdir -p "$2" && cd "$2" && pwd)
install_wheel=${3:-}
[[ -z "$install_wheel" || "$install_wheel" == "--install" ]] || usage

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
patch_file=${TRTLLM_GUARD_PATCH:-$script_dir/trtllm-capacity-scheduler-guard.patch}
cuda_archs=${TRTLLM_CUDA_ARCHS:-"90-real;100-real"}
jobs=${TRTLLM_BUILD_JOBS:-$(nproc)}
src_dir=${TRTLLM_SRC_DIR:-/tmp/TensorRT-LLM}

echo "Cloning TensorRT-LLM ${tag} into ${src_dir}"
rm -rf "$src_dir"
git clone --branch "$tag" --depth 1 --recurse-submodules --shallow-submodules \
    "$REPO_URL" "$src_dir"
cd "$src_dir"
git lfs install --local
git lfs pull

if ! git apply --check "$patch_file"; then
    echo "error: ${patch_file} does not apply to ${SCHEDULER_FILE} at ${tag}." >&2
    echo "The scheduler source moved; re-check the three cross-KV reuse sites." >&2
    exit 1
fi
git apply "$patch_file"
guards=$(grep -c 'getEncoderUniqueTokens().has_value()' "$SCHEDULER_FILE" || true)
if [[ "$guards" -ne "$EXPECTED_GUARDS" ]]; then
    echo "error: expected ${EXPECTED_GUARDS} guarded sites, found ${guards}" >&2
    exit 1
fi
echo "Guard applied at ${guards} sites of ${SCHEDULER_FILE}"

python3 scripts/build_wheel.py --clean --skip-stubs \
    --cuda_architectures "$cuda_archs" --job_count "$jobs" --dist_dir "$wheel_dir"

shopt -s nullglob
wheels=("$wheel_dir"/tensorrt_llm-*.whl)
if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "error: expected one tensorrt_llm wheel in ${wheel_dir}, found ${#wheels[@]}" >&2
    exit 1
fi
echo "Built ${wheels[0]}"

if [[ "$install_wheel" == "--install" ]]; then
    # --no-deps: keep the image's torch and every other pinned dependency as they are.
    python3 -m pip install --no-cache-dir --no-deps --force-reinstall "${wheels[0]}"
fi
