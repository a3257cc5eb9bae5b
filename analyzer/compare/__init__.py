"""`gpuadvise compare BEFORE AFTER`: two analyses side by side: what changed, whether the fix worked as predicted."""
