"""evidence: from two sets of hidden states to numbers and decisions.

Per-token sums and scores, norms, token pairing, confidence bars, capture fingerprints and
their scoring, and the findings derived from placed slots. Imports ``io`` and the bottom
(``errors``, ``positions``, ``results``); never ``engines``, ``scan``, ``report`` or the pipeline.
"""
