"""Host cost of the C launch path without a GPU (``tmaflow.bench.host_cost``): ns (or, with
``--instructions``, callgrind's instruction count) per call of a launcher's C plan and of
``Kernel.launch`` around it, for the argument mixes of ``python -m tmaflow bench --only
launch``, with a C stub in place of the driver's ``cuLaunchKernelEx``. ``--against`` times
another checkout (e.g. ``git worktree add .base ae3d113``) in alternating processes:

    PYTHONPATH=. python tools/experiments/launch_host_cost.py --against .base
    PYTHONPATH=. python tools/experiments/launch_host_cost.py --against .base --instructions --processes 1
"""
from tmaflow.bench import host_cost

if __name__ == "__main__":
    host_cost.main()
