"""`gpuadvise profile`: runs the user's script under torch.profiler in a child process and writes a run folder.

`gpuadvise.capture(...)` is also the public context manager (gpuadvise/api/capture.py). Python sets
the attribute `gpuadvise.capture` to this package the moment it is first imported, replacing that
function; so the package itself is callable and does the same.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, out, **options):
        from gpuadvise.api.capture import Capture

        return Capture(out, **options)


sys.modules[__name__].__class__ = _CallablePackage
