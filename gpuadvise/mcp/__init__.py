"""`gpuadvise mcp`: the analysis as tools an AI assistant calls, over the Model Context Protocol (stdio).

cli.py is the command (it checks that the `mcp` extra is installed, then serves); server.py the tools and
resources, each a thin call into `gpuadvise.analyzer.run` and the report model; analyses.py the analyses
the server keeps and how one runs for a call (a worker thread, progress, cancellation); profiling.py the
`profile` tool's run of `gpuadvise profile`; results.py the size and paging of what a call returns.
Like the TUI, it reads the analysis only through run/'s API (tests/test_architecture.py); it never
imports torch (the `profile` tool runs `gpuadvise profile` as its own process).
"""
