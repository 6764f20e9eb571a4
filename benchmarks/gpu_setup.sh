# Sourced by the GPU scripts after they set $work: flashcheck's src on PYTHONPATH, fla-core's wheels
# and the other carried wheels (fla_site.sh), and the machine's torch, Triton and GPU in $work/machine.txt.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/fla_site.sh"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
torch.cuda.get_device_name())" > "$work/machine.txt"
