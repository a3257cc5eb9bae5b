"""`gpuadvise view`: a terminal UI over the analysis model (findings, steps, timeline, tables, memory).

Everything here reads `list[TraceReport]` from the analysis engine; nothing imports torch. Heavy work
(loading, analysis, the timeline index) runs in thread workers so the UI paints at once.
"""
