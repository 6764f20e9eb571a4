# Sourced by the GPU session scripts: `pin LANE CMD...` runs CMD on that lane's GPU and half of the cores
# of a two-GPU host (both lanes share GPU 0 and every core on a one-GPU host). Needs $gpus and $cores.
pin() {
  local lane=$1; shift
  local gpu=$((gpus > 1 ? lane : 0)) half=$((cores / 2))
  if [ "$gpus" -gt 1 ] && command -v taskset > /dev/null; then
    CUDA_VISIBLE_DEVICES=$gpu taskset -c $((lane * half))-$((lane * half + half - 1)) "$@"
  else
    CUDA_VISIBLE_DEVICES=$gpu "$@"
  fi
}
