# Source before running vLLM on CPU (bash scripts/setup_vllm.sh does): caches and sockets inside the project,
# all cores bound, a small KV-cache pool.
_KVB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VLLM_CACHE_ROOT="$_KVB_ROOT/.kvbench_cache/vllm"
export TORCHINDUCTOR_CACHE_DIR="$_KVB_ROOT/.kvbench_cache/vllm/inductor"
export TMPDIR="$_KVB_ROOT/.kvbench_cache/vllm/tmp"
mkdir -p "$VLLM_CACHE_ROOT" "$TORCHINDUCTOR_CACHE_DIR" "$TMPDIR"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$(($(nproc) - 1))}"
export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
