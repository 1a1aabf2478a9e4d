"""report: what people look at.

Plots (align, runs, scan), notebook display helpers, the papermill -> nbconvert pipeline that
turns a parameterised notebook into one self-contained HTML page, the interactive explorer,
and the JupyterLab launcher on working copies of the notebooks (``lab``). The top room with
``cli``: it may import every room below it.
"""
