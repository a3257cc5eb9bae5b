"""What the kernels do and could do: `gemm.py` (matrix multiplies with their shapes, FLOPs and kernels),
`flops.py` (the FLOPs of every op that recorded its shapes), `passes.py` (forward, backward or
recomputed: which pass each op ran in), `recompute.py` (activation checkpointing's forward ops run
again), `utilization.py` (MFU and HFU), `roofline.py` (the least time a matmul kernel can take on the
device), `precision.py` (what each precision fix does to a step's kernels), `layout.py` (the layout
conversions around convolutions) and `attention.py` (the path each attention call took, fused or not).

May import: analyzer.model, analyzer.measure.basics, analyzer.measure.compiled (the matmul kernels a
CUDA graph replayed, by the ops captured into it).
"""
