"""gpuadvise: explains why PyTorch training leaves the GPU idle, and what to change."""

__version__ = "0.1.0"


def step() -> None:
    """Mark the end of one training iteration for `gpuadvise profile`.

    Only needed for loops that call no `optimizer.step()` and read no DataLoader; once called, it is
    the only step signal. Outside `gpuadvise profile` it does nothing.
    """
    from gpuadvise.capture.session import active

    session = active()
    if session is not None:
        session.manual_step()
