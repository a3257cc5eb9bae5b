"""The screens of `gpuadvise view`, one module each; `base.ViewScreen` holds what they share."""
