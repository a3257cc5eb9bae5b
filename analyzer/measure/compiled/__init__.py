"""Compiled code: `compiledtrace.py` (torch.compile's work in the trace: each step's time inside compiled
graphs and in the eager islands between them, and the compile facts a trace alone shows),
`cudagraphs.py` (the kernels a CUDA graph replayed, given back to the ops captured into it) and
`launchcost.py` (where the launching thread's CPU time per kernel goes: what compiling or CUDA graphs
remove). The compiler's own compile spans are a one-time cost the step figures leave out, so they are
found with the basics (basics/compilework.py).

May import: analyzer.model, analyzer.measure.basics.
"""
