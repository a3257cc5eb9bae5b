"""What the run had on, from run.json and the trace alike (the trace decides what ran):
`switches_on.py` (the usual speed switches, on, off or built but not acting, with the evidence; advice
never asks for what is on) and `frameworks.py` (the training frameworks the run used, a fix's paragraphs
kept to them).

May import: analyzer.model, analyzer.measure.basics, analyzer.measure.efficiency (the layout conversions
that show channels-last acting).
"""
