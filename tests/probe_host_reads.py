"""Host reads of tensors made by a script, recorded: imported first in the script's process
(`probe_script(..., preload=["probe_host_reads"], env=script_env(PROBE_HOST_READS=path))`), it wraps the torch.Tensor
methods that bring a value to the host (item, tolist, cpu, numpy, and bool / float / int of a tensor), and appends one
line "line function method" to the file named by $PROBE_HOST_READS for each call made directly from a script in
cleanrl/. On a GPU each one is a device-to-host copy that waits for the device; on the CPU they cost nothing, so this
record is how a CPU test sees whether a loop that should stay on the device does.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

LOG = os.environ["PROBE_HOST_READS"]
METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def recorded(name: str, method):
    @functools.wraps(method)
    def host_read(self, *args, **kwargs):
        caller = sys._getframe(1)
        if os.path.basename(os.path.dirname(caller.f_code.co_filename)) == "cleanrl":
            with open(LOG, "a") as log:
                log.write(f"{caller.f_lineno} {caller.f_code.co_name} {name}\n")
        return method(self, *args, **kwargs)

    return host_read


for _name in METHODS:
    setattr(torch.Tensor, _name, recorded(_name, getattr(torch.Tensor, _name)))
