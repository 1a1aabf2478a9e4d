"""report: what people look at.

Plots (align, runs, scan), notebook display helpers, the papermill -> nbconvert pipeline that
turns a parameterised notebook into one self-contained HTML page, and the interactive
explorer. The top room with ``cli``: it may import every room below it.
"""
