"""evidence: from two sets of hidden states to numbers and decisions.

Per-token sums and scores, norms, token pairing, confidence bars, capture fingerprints and
their scoring, the findings derived from placed slots, and for ``plan`` the cost of a speculative
round fitted from runs (``roundcost``), accept length per step count (``acceptcurve``) and the
serving-gap bar (``servinggap``). Imports ``io`` and the bottom
(``errors``, ``positions``, ``results``); never ``engines``, ``scan``, ``report`` or the pipeline.
"""
