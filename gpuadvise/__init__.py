"""gpuadvise: explains why PyTorch training leaves the GPU idle, and what to change."""

__version__ = "0.1.0"
